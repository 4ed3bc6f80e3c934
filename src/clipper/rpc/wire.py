"""Clipper RPC v3 framing plus our FAST extension: pure encoders and decoders, no sockets.

Every message here is the list of ZeroMQ frames *after* the identity frame (the frontend's
ROUTER adds and strips identities itself). Integers are little-endian: ``u32`` = ``"<I"``,
``u64`` = ``"<Q"``.

Frontend -> container::

    heartbeat reply   [b"", u32 3, u32 2, u32 heartbeat_type]
    v3 predict        [b"", u32 3, u32 1, u32 msg_id, u32 0, u64 8*(2+n),
                       u64[2+n] = [input_code, n, size_0..size_{n-1}], item_0, ..., item_{n-1}]
    FAST predict      [b"", u32 3, u32 1, u32 msg_id, u32 16, meta, payload]
                      meta = JSON {"type": name, "n": n, "sizes": [...]} or, for numeric types
                      whose items all have the same size, {"type", "n", "shape": [n, d]};
                      payload = the items concatenated. A traced batch's meta also has
                      "traceparent": the W3C header of the frontend's span for the batch's
                      round trip (our containers make their predict span its child; a reader
                      that does not know the key ignores it).
    goodbye ack       a heartbeat reply of type 2 (ours): the frontend sends this container no
                      more batches; those already sent are still answered.
    artifact chunk    [b"", u32 3, u32 18, meta, data] (ours): meta = JSON {"sha256", "size",
                      "kind": "file" | "tar", "offset"} and data = up to the asked bytes from
                      ``offset``, or meta = {"error": text} and an empty data frame.
    FRONTENDS         [b"", u32 3, u32 19, addr_0, ..., addr_{n-1}] (ours): every live
                      frontend's RPC address (UTF-8 ``tcp://host:port``, at most
                      MAX_FRONTENDS of them, each at most MAX_ADDRESS_BYTES): a shared replica
                      dials each one it has no link to and drops links to the others.
    RETIRE            [b"", u32 3, u32 20] (ours): say goodbye on every link, answer the
                      batches held, and exit 0.
    LOCAL_SOCKETS     [b"", u32 3, u32 22, tcp_0, ipc_0, ..., tcp_{n-1}, ipc_{n-1}] (ours):
                      the private Unix socket (``ipc:///path``) of each live frontend that has
                      one, by its FRONTENDS address; sent before FRONTENDS, only to a replica
                      whose metadata lists the ``local-sockets`` feature. A replica on the same
                      machine dials the socket instead of the TCP address.

Container -> frontend::

    heartbeat         [b"", u32 2]
    new container     [b"", u32 0, name, version, b"<input code as decimal>", u32 3,
                       (optional) b"clipper-serve/fast1", (optional) replica token,
                       (optional) features: comma-separated ASCII names (ours:
                       ``local-sockets``)]
    v3 response       [b"", u32 1, msg_id (4 raw bytes), u64 8*(n+1),
                       u64[n+1] = [n, len_0..len_{n-1}], out_0, ..., out_{n-1}]
    FAST response     [b"", u32 16, msg_id (4 raw bytes), u32 status, body]
                      status 0: body = JSON list of outputs; status 1: body = UTF-8 error text;
                      status 2 (ours): body = JSON {"outputs": [...], "errors": {"i": text}}:
                      the outputs at the indices in "errors" could not be served (NaN, not
                      JSON; clipper.rpc.outputs), each its input's model error.
    goodbye           [b"", u32 17] (ours): the container is leaving (SIGTERM); send it no more
                      batches. Answered with a goodbye ack.
    queue report      [b"", u32 21, u32 queued, u32 mine] (ours): the batches this container
                      has received from every frontend and not answered yet, and how many of
                      them came on this link; sent after each heartbeat, only on a link whose
                      frontend has shown it speaks our extensions.
    artifact request  [b"", u32 18, name, version, u64 offset, u32 max_bytes] (ours): a part of
                      the model version's artifact (max_bytes 0: only its meta). Needs no
                      registration: a CURVE-authenticated connection is enough.

The original frontend and ``rpc.py`` never see our messages: a container sends them only to a
frontend that speaks the FAST framing.

Decoders accept ``bytes`` or ``memoryview`` frames (so a receiver may use ``copy=False`` and
keep a large payload zero-copy) and raise :class:`~clipper.errors.WireError` naming the frame
index (counted after the identity frame) and what was expected.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import orjson

from clipper.errors import WireError
from clipper.inputs import InputType
from clipper.rpc.outputs import OutputRefused

__all__ = [
    "ARTIFACT_CHUNK_MAX",
    "FAST_TOKEN",
    "LOCAL_SOCKETS_FEATURE",
    "MAX_ADDRESS_BYTES",
    "MAX_FRONTENDS",
    "RPC_VERSION",
    "ArtifactChunk",
    "ArtifactRequest",
    "Frame",
    "Frontends",
    "Goodbye",
    "Heartbeat",
    "HeartbeatReply",
    "HeartbeatType",
    "LocalSockets",
    "MessageType",
    "NewContainer",
    "PredictRequest",
    "PredictResponse",
    "QueueReport",
    "RequestType",
    "Retire",
    "decode_container_message",
    "decode_frontend_message",
    "embed_output",
    "encode_artifact_chunk",
    "encode_artifact_request",
    "encode_frontends",
    "encode_goodbye",
    "encode_heartbeat",
    "encode_heartbeat_reply",
    "encode_local_sockets",
    "encode_new_container",
    "encode_predict_error_fast",
    "encode_predict_fast",
    "encode_predict_response_fast",
    "encode_predict_response_partial",
    "encode_predict_response_v3",
    "encode_predict_v3",
    "encode_queue_report",
    "encode_retire",
    "encode_update_fast",
    "json_default",
]

RPC_VERSION = 3
# Appended after the RPC version in metadata; the original frontend never reads that far.
FAST_TOKEN = b"clipper-serve/fast1"

Frame = bytes | memoryview
"""A received frame: ``bytes``, or a byte-format ``memoryview`` (zmq ``copy=False``)."""


class MessageType(enum.IntEnum):
    NEW_CONTAINER = 0
    CONTAINER_CONTENT = 1
    HEARTBEAT = 2
    FAST_CONTENT = 16  # ours: a FAST response
    GOODBYE = 17  # ours: the container is leaving
    ARTIFACT = 18  # ours: an artifact request (container) or chunk (frontend)
    FRONTENDS = 19  # ours: frontend -> container, every live frontend's address
    RETIRE = 20  # ours: frontend -> container, drain every link and exit
    QUEUE_REPORT = 21  # ours: container -> frontend, its batches not answered yet
    LOCAL_SOCKETS = 22  # ours: frontend -> container, the live frontends' Unix sockets


class HeartbeatType(enum.IntEnum):
    KEEP_ALIVE = 0
    REQUEST_CONTAINER_METADATA = 1
    GOODBYE_ACK = 2  # ours: no more batches will come


class RequestType(enum.IntEnum):
    PREDICT = 0
    FEEDBACK = 1
    FAST_PREDICT = 16  # ours
    FAST_UPDATE = 17  # ours: feedback for models with update(inputs, labels)


_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# Constant frames, packed once: the hot path only packs msg_id and the header.
_EMPTY = b""
_P_VERSION = _U32.pack(RPC_VERSION)
_P_NEW_CONTAINER = _U32.pack(MessageType.NEW_CONTAINER)
_P_CONTENT = _U32.pack(MessageType.CONTAINER_CONTENT)
_P_HEARTBEAT = _U32.pack(MessageType.HEARTBEAT)
_P_FAST_CONTENT = _U32.pack(MessageType.FAST_CONTENT)
_P_GOODBYE = _U32.pack(MessageType.GOODBYE)
_P_ARTIFACT = _U32.pack(MessageType.ARTIFACT)
_P_FRONTENDS = _U32.pack(MessageType.FRONTENDS)
_P_QUEUE_REPORT = _U32.pack(MessageType.QUEUE_REPORT)
_P_RETIRE = _U32.pack(MessageType.RETIRE)
_P_LOCAL_SOCKETS = _U32.pack(MessageType.LOCAL_SOCKETS)
_P_PREDICT = _U32.pack(RequestType.PREDICT)
_P_FAST_PREDICT = _U32.pack(RequestType.FAST_PREDICT)
_P_STATUS_OK = _U32.pack(0)
_P_STATUS_ERROR = _U32.pack(1)
_P_STATUS_PARTIAL = _U32.pack(2)

_JSON_OPTS = orjson.OPT_SERIALIZE_NUMPY
# The most an artifact request may ask for in one chunk.
ARTIFACT_CHUNK_MAX = 4 * 2**20
# Bounds on a FRONTENDS message, so a bad one cannot make a replica open links without limit.
MAX_FRONTENDS = 64
MAX_ADDRESS_BYTES = 256
# A container that dials a frontend's private Unix socket when it is on the same machine
# (LOCAL_SOCKETS) says so in its metadata; other containers are never sent that message.
LOCAL_SOCKETS_FEATURE = "local-sockets"


# ---------------------------------------------------------------------------------------------
# Decoded messages


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Container -> frontend keep-alive."""


@dataclass(frozen=True, slots=True)
class NewContainer:
    """Container metadata; ``rpc_version`` is None when the optional frame is missing."""

    name: str
    version: str
    input_code: int
    rpc_version: int | None
    fast: bool
    token: str = ""
    features: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Goodbye:
    """Container -> frontend: it is leaving; send it no more batches."""


@dataclass(frozen=True, slots=True)
class QueueReport:
    """Container -> frontend: its batches received from every frontend and not answered yet
    (``queued``), ``mine`` of them from the frontend this report goes to."""

    queued: int
    mine: int

    @property
    def elsewhere(self) -> int:
        """The batches other frontends have queued on it."""
        return max(self.queued - self.mine, 0)


@dataclass(frozen=True, slots=True)
class Frontends:
    """Frontend -> container: every live frontend's RPC address."""

    addresses: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LocalSockets:
    """Frontend -> container: ``(tcp address, ipc address)`` for each live frontend with a
    private Unix socket."""

    pairs: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Retire:
    """Frontend -> container: drain every link and exit."""


@dataclass(frozen=True, slots=True)
class ArtifactRequest:
    """Container -> frontend: ``max_bytes`` of the version's artifact from ``offset``."""

    name: str
    version: str
    offset: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class ArtifactChunk:
    """Frontend -> container: a part of an artifact, or why there is none (``error``)."""

    meta: dict[str, Any]
    data: Frame

    @property
    def error(self) -> str | None:
        err = self.meta.get("error")
        return None if err is None else str(err)


@dataclass(frozen=True, slots=True)
class PredictResponse:
    """A batch's outputs (``outputs``) or the model's error (``error``), never both.

    ``raw_strings`` is True for v3 responses: the outputs are the container's strings, which
    the frontend may still try to parse as JSON. FAST outputs are already JSON values.
    """

    msg_id: int
    outputs: list[object] | None
    error: str | None
    raw_strings: bool


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    """Frontend -> container answer to a heartbeat; ``type`` is a :class:`HeartbeatType`."""

    type: int


@dataclass(frozen=True, slots=True)
class PredictRequest:
    """A batch of ``n`` inputs.

    v3: ``items`` holds one frame per input and ``fast_meta``/``payload`` are None.
    FAST: ``fast_meta`` is the decoded meta, ``payload`` the concatenated items, and ``items``
    is None. ``sizes`` (bytes per item) is set unless FAST sent a ``shape`` instead; ``shape``
    is ``(n, d)`` in elements. ``type_name`` is the FAST readable type name (v3 has only the
    code, which strings and json share).
    """

    msg_id_bytes: bytes
    input_code: int
    items: list[Frame] | None
    fast_meta: dict[str, Any] | None
    payload: Frame | None
    n: int = 0
    sizes: tuple[int, ...] | None = None
    shape: tuple[int, int] | None = None
    type_name: str | None = None
    labels: list[Any] | None = None  # set for FAST_UPDATE: the labels of the inputs

    def item_frames(self) -> list[Frame]:
        """The inputs one per item; FAST payloads are sliced without copying."""
        if self.items is not None:
            return self.items
        assert self.payload is not None  # decode guarantees one of the two
        view = memoryview(self.payload)
        if self.sizes is not None:
            out: list[Frame] = []
            pos = 0
            for size in self.sizes:
                out.append(view[pos : pos + size])
                pos += size
            return out
        assert self.shape is not None
        step = len(view) // self.n if self.n else 0
        return [view[i * step : (i + 1) * step] for i in range(self.n)]


# ---------------------------------------------------------------------------------------------
# Frontend -> container: encoders (frontend) and decoder (container)


def encode_heartbeat_reply(heartbeat_type: int) -> list[bytes]:
    return [_EMPTY, _P_VERSION, _P_HEARTBEAT, _U32.pack(heartbeat_type)]


def encode_predict_v3(
    msg_id: int, input_type: InputType | int, items: Sequence[bytes]
) -> list[bytes]:
    """A v3 predict request; ``items`` are raw item bytes (one frame each)."""
    code = input_type if isinstance(input_type, int) else input_type.code
    n = len(items)
    try:
        mid = _U32.pack(msg_id)
    except struct.error:
        raise WireError(f"msg_id {msg_id} does not fit a u32") from None
    # One pack call for the whole header; struct caches the compiled format per n.
    header = struct.pack(f"<{n + 2}Q", code, n, *map(len, items))
    return [_EMPTY, _P_VERSION, _P_CONTENT, mid, _P_PREDICT, _U64.pack(8 * (n + 2)), header, *items]


def encode_update_fast(
    msg_id: int, input_type: InputType, items: Sequence[bytes], labels: Sequence[Any]
) -> list[bytes]:
    """Feedback for a model that learns online: the fast predict framing, request type
    FAST_UPDATE, the labels in the meta frame."""
    frames = encode_predict_fast(msg_id, input_type, items)
    meta = orjson.loads(frames[5])
    meta["labels"] = list(labels)
    frames[4] = _U32.pack(RequestType.FAST_UPDATE)
    frames[5] = orjson.dumps(meta, option=_JSON_OPTS)
    return frames


def encode_predict_fast(
    msg_id: int, input_type: InputType, items: Sequence[bytes], traceparent: str | None = None
) -> list[bytes]:
    """A FAST predict request: JSON meta plus one contiguous payload; ``traceparent``: the
    batch's trace context (clipper.tracing), in the meta."""
    n = len(items)
    try:
        mid = _U32.pack(msg_id)
    except struct.error:
        raise WireError(f"msg_id {msg_id} does not fit a u32") from None
    sizes = list(map(len, items))
    meta: dict[str, object]
    if (
        n
        and input_type.numeric
        and sizes.count(sizes[0]) == n
        and sizes[0] % input_type.itemsize == 0
    ):
        meta = {"type": input_type.readable, "n": n, "shape": [n, sizes[0] // input_type.itemsize]}
    else:
        meta = {"type": input_type.readable, "n": n, "sizes": sizes}
    if traceparent is not None:
        meta["traceparent"] = traceparent
    return [
        _EMPTY,
        _P_VERSION,
        _P_CONTENT,
        mid,
        _P_FAST_PREDICT,
        orjson.dumps(meta),
        b"".join(items),
    ]


def encode_artifact_chunk(meta: dict[str, Any], data: bytes) -> list[bytes]:
    return [_EMPTY, _P_VERSION, _P_ARTIFACT, orjson.dumps(meta), data]


def encode_frontends(addresses: Sequence[str]) -> list[bytes]:
    """FRONTENDS (fast containers only); raises :class:`WireError` past the bounds the
    decoder enforces, so a frontend never sends what every replica would drop."""
    encoded = [a.encode() for a in addresses]
    _check_frontends(encoded)
    return [_EMPTY, _P_VERSION, _P_FRONTENDS, *encoded]


def encode_local_sockets(pairs: Sequence[tuple[str, str]]) -> list[bytes]:
    """LOCAL_SOCKETS (only to a container with the ``local-sockets`` feature); raises
    :class:`WireError` for what the decoder would refuse."""
    encoded = [part.encode() for pair in pairs for part in pair]
    _check_local_sockets(encoded)
    return [_EMPTY, _P_VERSION, _P_LOCAL_SOCKETS, *encoded]


def encode_retire() -> list[bytes]:
    return [_EMPTY, _P_VERSION, _P_RETIRE]


def _check_frontends(addresses: Sequence[Frame]) -> None:
    if len(addresses) > MAX_FRONTENDS:
        raise WireError(f"frontends: at most {MAX_FRONTENDS} addresses, got {len(addresses)}")
    for i, a in enumerate(addresses):
        if not 0 < len(a) <= MAX_ADDRESS_BYTES:
            raise WireError(
                f"frame {3 + i} (frontend address): expected 1 to {MAX_ADDRESS_BYTES} bytes, "
                f"got {len(a)}"
            )


def _check_local_sockets(frames: Sequence[Frame]) -> None:
    if len(frames) % 2:
        raise WireError(f"local sockets: expected (tcp, ipc) pairs, got {len(frames)} frames")
    if len(frames) > 2 * MAX_FRONTENDS:
        raise WireError(f"local sockets: at most {MAX_FRONTENDS} pairs, got {len(frames) // 2}")
    for i, a in enumerate(frames):
        prefix, what = (b"tcp://", "tcp://host:port") if i % 2 == 0 else (b"ipc:///", "ipc:///path")
        if not 0 < len(a) <= MAX_ADDRESS_BYTES or bytes(a[: len(prefix)]) != prefix:
            raise WireError(
                f"frame {3 + i} (local socket): expected {what} of at most {MAX_ADDRESS_BYTES} "
                f"bytes, got {bytes(a[:64])!r}"
            )


def _decode_local_sockets(frames: Sequence[Frame]) -> LocalSockets:
    _check_local_sockets(frames[3:])
    parts = [_utf8(frames, i, "local socket") for i in range(3, len(frames))]
    return LocalSockets(tuple(zip(parts[::2], parts[1::2], strict=True)))


def _decode_frontends(frames: Sequence[Frame]) -> Frontends:
    _check_frontends(frames[3:])
    addresses = tuple(_utf8(frames, i, "frontend address") for i in range(3, len(frames)))
    for i, a in enumerate(addresses):
        if not a.startswith("tcp://") or ":" not in a[6:]:
            raise WireError(
                f"frame {3 + i} (frontend address): expected tcp://host:port, got {a!r}"
            )
    return Frontends(addresses)


def decode_frontend_message(
    frames: Sequence[Frame],
) -> HeartbeatReply | PredictRequest | ArtifactChunk | Frontends | LocalSockets | Retire:
    """Decode a frontend -> container message (the DEALER receives no identity frame)."""
    _need(frames, 3, "delimiter, RPC version, message type")
    _delimiter(frames)
    version = _u32(frames, 1, "RPC version")
    if version != RPC_VERSION:
        raise WireError(f"frame 1 (RPC version): expected {RPC_VERSION}, got {version}")
    mtype = _u32(frames, 2, "message type")
    if mtype == MessageType.HEARTBEAT:
        _need(frames, 4, "heartbeat type")
        return HeartbeatReply(_u32(frames, 3, "heartbeat type"))
    if mtype == MessageType.ARTIFACT:
        _need(frames, 5, "artifact meta, data")
        try:
            meta = orjson.loads(frames[3])
        except orjson.JSONDecodeError as e:
            raise WireError(f"frame 3 (artifact meta): not JSON: {e}") from None
        if not isinstance(meta, dict):
            raise WireError("frame 3 (artifact meta): expected a JSON object")
        return ArtifactChunk(meta, frames[4])
    if mtype == MessageType.FRONTENDS:
        return _decode_frontends(frames)
    if mtype == MessageType.LOCAL_SOCKETS:
        return _decode_local_sockets(frames)
    if mtype == MessageType.RETIRE:
        if len(frames) != 3:
            raise WireError(f"retire: expected 3 frames, got {len(frames)}")
        return Retire()
    if mtype != MessageType.CONTAINER_CONTENT:
        raise WireError(
            f"frame 2 (message type): expected {int(MessageType.HEARTBEAT)} (heartbeat) or "
            f"{int(MessageType.CONTAINER_CONTENT)} (container content), got {mtype}"
        )
    _need(frames, 5, "msg_id, request type")
    if len(frames[3]) != 4:
        raise WireError(f"frame 3 (msg_id): expected 4 bytes, got {len(frames[3])}")
    msg_id = bytes(frames[3])
    rtype = _u32(frames, 4, "request type")
    if rtype == RequestType.PREDICT:
        return _decode_predict_v3(frames, msg_id)
    if rtype == RequestType.FAST_PREDICT:
        return _decode_predict_fast(frames, msg_id)
    if rtype == RequestType.FAST_UPDATE:
        req = _decode_predict_fast(frames, msg_id)
        labels = req.fast_meta.get("labels") if req.fast_meta is not None else None
        if not isinstance(labels, list) or len(labels) != req.n:
            raise WireError(f'frame 5 (fast meta): "labels" must be a list of {req.n} labels')
        return replace(req, labels=labels)
    raise WireError(
        f"frame 4 (request type): expected {int(RequestType.PREDICT)} (predict) or "
        f"{int(RequestType.FAST_PREDICT)} (fast predict), got {rtype}"
    )


def _decode_predict_v3(frames: Sequence[Frame], msg_id: bytes) -> PredictRequest:
    _need(frames, 7, "header length, input header")
    header_len = _u64(frames, 5, "input header length")
    hdr = frames[6]
    if len(hdr) < 16 or len(hdr) % 8:
        raise WireError(
            f"frame 6 (input header): expected u64[2+n] (a multiple of 8, at least 16 bytes), "
            f"got {len(hdr)} bytes"
        )
    if header_len != len(hdr):
        raise WireError(f"frame 5 (input header length): says {header_len}, header has {len(hdr)}")
    words = struct.unpack(f"<{len(hdr) // 8}Q", hdr)
    code, n = words[0], words[1]
    if len(words) != n + 2:
        raise WireError(f"frame 6 (input header): n={n} needs {8 * (n + 2)} bytes, got {len(hdr)}")
    if len(frames) != 7 + n:
        raise WireError(f"expected {7 + n} frames for {n} input items, got {len(frames)}")
    sizes = words[2:]
    items = list(frames[7:])
    for i, (item, size) in enumerate(zip(items, sizes, strict=True)):
        if len(item) != size:
            raise WireError(
                f"frame {7 + i} (input item {i}): header says {size} bytes, got {len(item)}"
            )
    return PredictRequest(msg_id, code, items, None, None, n=n, sizes=sizes)


def _decode_predict_fast(frames: Sequence[Frame], msg_id: bytes) -> PredictRequest:
    if len(frames) != 7:
        raise WireError(f"fast predict: expected 7 frames (… meta, payload), got {len(frames)}")
    try:
        meta = orjson.loads(frames[5])
    except orjson.JSONDecodeError as e:
        raise WireError(f"frame 5 (fast meta): not JSON: {e}") from None
    if not isinstance(meta, dict):
        raise WireError(f"frame 5 (fast meta): expected a JSON object, got {type(meta).__name__}")
    name, n = meta.get("type"), meta.get("n")
    if not isinstance(name, str):
        raise WireError('frame 5 (fast meta): "type" must be an input type name')
    try:
        itype = InputType.parse(name)
    except ValueError as e:
        raise WireError(f"frame 5 (fast meta): {e}") from None
    if not _is_count(n):
        raise WireError('frame 5 (fast meta): "n" must be a non-negative integer')
    payload = frames[6]
    raw_shape, raw_sizes = meta.get("shape"), meta.get("sizes")
    sizes: tuple[int, ...] | None = None
    shape: tuple[int, int] | None = None
    if raw_shape is not None:
        if not (
            isinstance(raw_shape, list)
            and len(raw_shape) == 2
            and all(map(_is_count, raw_shape))
            and raw_shape[0] == n
        ):
            raise WireError(f'frame 5 (fast meta): "shape" must be [n={n}, d], got {raw_shape!r}')
        if not itype.numeric:
            raise WireError(f'frame 5 (fast meta): "shape" is only for numeric types, not {name}')
        shape = (raw_shape[0], raw_shape[1])
        expect = n * shape[1] * itype.itemsize
    elif raw_sizes is not None:
        if not (
            isinstance(raw_sizes, list) and len(raw_sizes) == n and all(map(_is_count, raw_sizes))
        ):
            raise WireError(f'frame 5 (fast meta): "sizes" must be {n} byte counts')
        sizes = tuple(raw_sizes)
        expect = sum(sizes)
    else:
        raise WireError('frame 5 (fast meta): needs "shape" or "sizes"')
    if len(payload) != expect:
        raise WireError(f"frame 6 (fast payload): meta says {expect} bytes, got {len(payload)}")
    return PredictRequest(
        msg_id,
        itype.code,
        None,
        meta,
        payload,
        n=n,
        sizes=sizes,
        shape=shape,
        type_name=itype.readable,
    )


# ---------------------------------------------------------------------------------------------
# Container -> frontend: encoders (container) and decoder (frontend)


def encode_heartbeat() -> list[bytes]:
    return [_EMPTY, _P_HEARTBEAT]


def encode_goodbye() -> list[bytes]:
    return [_EMPTY, _P_GOODBYE]


def encode_queue_report(queued: int, mine: int) -> list[bytes]:
    return [_EMPTY, _P_QUEUE_REPORT, _U32.pack(queued), _U32.pack(mine)]


def encode_artifact_request(name: str, version: str, offset: int, max_bytes: int) -> list[bytes]:
    return [
        _EMPTY,
        _P_ARTIFACT,
        name.encode(),
        version.encode(),
        _U64.pack(offset),
        _U32.pack(max_bytes),
    ]


def encode_new_container(
    name: str,
    version: str,
    input_code: int,
    *,
    fast: bool = True,
    token: str = "",
    features: Sequence[str] = (),
) -> list[bytes]:
    frames = [
        _EMPTY,
        _P_NEW_CONTAINER,
        name.encode(),
        version.encode(),
        str(input_code).encode("ascii"),
        _P_VERSION,
    ]
    if fast:
        frames.append(FAST_TOKEN)
        if token or features:
            # Ours only: the slot token the local manager gave this process, so the frontend
            # can tie the connection to the process (drain before stop, removal on exit).
            frames.append(token.encode())
        if features:
            frames.append(",".join(features).encode("ascii"))
    return frames


def encode_predict_response_v3(msg_id: bytes, outputs: Sequence[bytes | str]) -> list[bytes]:
    """A v3 response; ``str`` outputs are sent as UTF-8."""
    _check_msg_id(msg_id)
    outs = [o.encode() if isinstance(o, str) else o for o in outputs]
    n = len(outs)
    header = struct.pack(f"<{n + 1}Q", n, *map(len, outs))
    return [_EMPTY, _P_CONTENT, msg_id, _U64.pack(8 * (n + 1)), header, *outs]


def embed_output(text: str) -> Any:
    """The original's rule: an output string that parses as JSON is embedded as JSON."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def json_default(obj: Any) -> Any:
    """orjson fallback: arrays it cannot take directly (non-contiguous, object dtype), numpy
    scalars and sets. Anything else is not JSON and raises: its ``str`` (a ``repr`` with an
    address, for most objects) is not an answer to serve."""
    if isinstance(obj, np.ndarray | np.generic):
        return obj.tolist()
    if isinstance(obj, set | frozenset):
        return list(obj)
    raise TypeError(type(obj).__name__)  # orjson says "Type is not JSON serializable: <type>"


def encode_predict_response_fast(msg_id: bytes, outputs: Sequence[object] | Any) -> list[bytes]:
    """A FAST ok response; ``outputs`` is a list/tuple of JSON-able values or an ndarray.

    Raises ``orjson.JSONEncodeError`` for values even the fallback cannot encode.
    """
    _check_msg_id(msg_id)
    body = orjson.dumps(outputs, option=_JSON_OPTS, default=json_default)
    return [_EMPTY, _P_FAST_CONTENT, msg_id, _P_STATUS_OK, body]


def encode_predict_response_partial(
    msg_id: bytes, outputs: Sequence[object], errors: dict[int, str]
) -> list[bytes]:
    """A FAST response (status 2) whose outputs at the indices of ``errors`` cannot be served
    (sent as ``null``); each index's text says why."""
    _check_msg_id(msg_id)
    outs = [None if i in errors else o for i, o in enumerate(outputs)]
    doc = {"outputs": outs, "errors": {str(i): text for i, text in errors.items()}}
    body = orjson.dumps(doc, option=_JSON_OPTS, default=json_default)
    return [_EMPTY, _P_FAST_CONTENT, msg_id, _P_STATUS_PARTIAL, body]


def encode_predict_error_fast(msg_id: bytes, message: str) -> list[bytes]:
    """A FAST error response (status 1): the model raised; ``message`` says what."""
    _check_msg_id(msg_id)
    return [_EMPTY, _P_FAST_CONTENT, msg_id, _P_STATUS_ERROR, message.encode("utf-8", "replace")]


def decode_container_message(
    frames: Sequence[Frame],
) -> Heartbeat | NewContainer | PredictResponse | Goodbye | ArtifactRequest | QueueReport:
    """Decode a container -> frontend message (identity frame already stripped)."""
    _need(frames, 2, "delimiter, message type")
    _delimiter(frames)
    mtype = _u32(frames, 1, "message type")
    if mtype == MessageType.HEARTBEAT:
        return Heartbeat()
    if mtype == MessageType.CONTAINER_CONTENT:
        return _decode_response_v3(frames)
    if mtype == MessageType.FAST_CONTENT:
        return _decode_response_fast(frames)
    if mtype == MessageType.NEW_CONTAINER:
        return _decode_new_container(frames)
    if mtype == MessageType.GOODBYE:
        return Goodbye()
    if mtype == MessageType.ARTIFACT:
        _need(frames, 6, "model name, model version, offset, max bytes")
        max_bytes = _u32(frames, 5, "max bytes")
        if max_bytes > ARTIFACT_CHUNK_MAX:
            raise WireError(f"frame 5 (max bytes): at most {ARTIFACT_CHUNK_MAX}, got {max_bytes}")
        return ArtifactRequest(
            _utf8(frames, 2, "model name"),
            _utf8(frames, 3, "model version"),
            _u64(frames, 4, "offset"),
            max_bytes,
        )
    if mtype == MessageType.QUEUE_REPORT:
        if len(frames) != 4:
            raise WireError(f"queue report: expected 4 frames, got {len(frames)}")
        queued, mine = _u32(frames, 2, "queued"), _u32(frames, 3, "mine")
        if mine > queued:
            raise WireError(f"frame 3 (mine): {mine} is more than the {queued} queued")
        return QueueReport(queued, mine)
    raise WireError(f"frame 1 (message type): expected 0, 1, 2, 16, 17, 18 or 21, got {mtype}")


def _decode_new_container(frames: Sequence[Frame]) -> NewContainer:
    _need(frames, 5, "model name, model version, input type")
    name = _utf8(frames, 2, "model name")
    version = _utf8(frames, 3, "model version")
    code_text = bytes(frames[4])
    if not code_text.isdigit() and not (code_text[:1] == b"-" and code_text[1:].isdigit()):
        raise WireError(f"frame 4 (input type): expected a decimal ASCII code, got {code_text!r}")
    # The version frame is optional in the original (checked with more()); so is ours.
    rpc_version = _u32(frames, 5, "RPC version") if len(frames) > 5 else None
    fast = len(frames) > 6 and bytes(frames[6]) == FAST_TOKEN
    token = _utf8(frames, 7, "replica token") if fast and len(frames) > 7 else ""
    features: frozenset[str] = frozenset()
    if fast and len(frames) > 8:
        features = frozenset(f for f in _utf8(frames, 8, "features").split(",") if f)
    return NewContainer(name, version, int(code_text), rpc_version, fast, token, features)


def _decode_response_v3(frames: Sequence[Frame]) -> PredictResponse:
    _need(frames, 5, "msg_id, header length, output header")
    msg_id = _msg_id(frames)
    _u64(frames, 3, "output header length")  # the original ignores its value; so do we
    hdr = frames[4]
    if len(hdr) < 8 or len(hdr) % 8:
        raise WireError(
            f"frame 4 (output header): expected u64[n+1] (a non-zero multiple of 8 bytes), "
            f"got {len(hdr)} bytes"
        )
    words = struct.unpack(f"<{len(hdr) // 8}Q", hdr)
    n = words[0]
    if len(words) != n + 1:
        raise WireError(f"frame 4 (output header): n={n} needs {8 * (n + 1)} bytes, got {len(hdr)}")
    if len(frames) != 5 + n:
        raise WireError(f"expected {5 + n} frames for {n} outputs, got {len(frames)}")
    outputs: list[object] = []
    for i in range(n):
        f = frames[5 + i]
        if len(f) != words[1 + i]:
            raise WireError(
                f"frame {5 + i} (output {i}): header says {words[1 + i]} bytes, got {len(f)}"
            )
        outputs.append(_utf8(frames, 5 + i, f"output {i}"))
    return PredictResponse(msg_id, outputs, None, True)


def _decode_response_fast(frames: Sequence[Frame]) -> PredictResponse:
    if len(frames) != 5:
        raise WireError(
            f"fast response: expected 5 frames (…, msg_id, status, body), got {len(frames)}"
        )
    msg_id = _msg_id(frames)
    status = _u32(frames, 3, "status")
    if status == 0:
        try:
            outputs = orjson.loads(frames[4])
        except orjson.JSONDecodeError as e:
            # The framing holds, so the batch is known: its inputs get a model error now rather
            # than waiting out their deadline (a number too large for a double says "infinity").
            return PredictResponse(msg_id, None, f"the outputs are not JSON: {e}", False)
        if not isinstance(outputs, list):
            raise WireError(
                f"frame 4 (fast body): expected a JSON list, got {type(outputs).__name__}"
            )
        return PredictResponse(msg_id, outputs, None, False)
    if status == 1:
        return PredictResponse(msg_id, None, bytes(frames[4]).decode("utf-8", "replace"), False)
    if status == 2:
        return _decode_partial(msg_id, frames[4])
    raise WireError(f"frame 3 (status): expected 0 (ok), 1 (error) or 2 (partial), got {status}")


def _decode_partial(msg_id: int, body: Frame) -> PredictResponse:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        return PredictResponse(msg_id, None, f"the outputs are not JSON: {e}", False)
    outputs = doc.get("outputs") if isinstance(doc, dict) else None
    errors = doc.get("errors") if isinstance(doc, dict) else None
    if not isinstance(outputs, list) or not isinstance(errors, dict):
        raise WireError('frame 4 (partial body): expected {"outputs": [...], "errors": {...}}')
    for key, text in errors.items():
        if not key.isdigit() or int(key) >= len(outputs):
            raise WireError(
                f"frame 4 (partial body): error index {key!r} is not one of the "
                f"{len(outputs)} outputs"
            )
        outputs[int(key)] = OutputRefused(str(text))
    return PredictResponse(msg_id, outputs, None, False)


# ---------------------------------------------------------------------------------------------
# Helpers


def _need(frames: Sequence[Frame], count: int, what: str) -> None:
    if len(frames) < count:
        raise WireError(f"message has {len(frames)} frames; expected at least {count} ({what})")


def _delimiter(frames: Sequence[Frame]) -> None:
    if len(frames[0]) != 0:
        raise WireError(f"frame 0 (delimiter): expected an empty frame, got {len(frames[0])} bytes")


def _u32(frames: Sequence[Frame], i: int, what: str) -> int:
    f = frames[i]
    if len(f) != 4:
        raise WireError(f"frame {i} ({what}): expected a 4-byte u32, got {len(f)} bytes")
    value: int = _U32.unpack(f)[0]
    return value


def _u64(frames: Sequence[Frame], i: int, what: str) -> int:
    f = frames[i]
    if len(f) != 8:
        raise WireError(f"frame {i} ({what}): expected an 8-byte u64, got {len(f)} bytes")
    value: int = _U64.unpack(f)[0]
    return value


def _msg_id(frames: Sequence[Frame]) -> int:
    return _u32(frames, 2, "msg_id")


def _utf8(frames: Sequence[Frame], i: int, what: str) -> str:
    try:
        return bytes(frames[i]).decode("utf-8")
    except UnicodeDecodeError as e:
        raise WireError(f"frame {i} ({what}): not UTF-8: {e}") from None


def _check_msg_id(msg_id: bytes) -> None:
    if len(msg_id) != 4:
        raise WireError(f"msg_id must be the 4 raw bytes of the request, got {len(msg_id)} bytes")


def _is_count(v: object) -> bool:
    return type(v) is int and v >= 0
