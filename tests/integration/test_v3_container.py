"""A container written here from the spec (clipper-original.md section 4), speaking plain RPC v3
only: no FAST token in its metadata, v3 predict requests, UTF-8 string outputs. It stands for
the original ``rpc.py``: the frontend must serve it unchanged. It cannot do CURVE, so these
frontends run with ``rpc_auth=False`` (``--no-rpc-auth``), which is allowed only on a loopback
RPC host; with authentication on it is refused (tests/integration/test_rpc_auth.py).

The container runs in a thread with its own pyzmq context and a DEALER socket; it records every
frame it receives so the tests can check the frontend's side of the protocol too.
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import zmq

from clipper import BatchingConfig, Clipper
from clipper.inputs import InputType
from clipper.registry import ModelVersion
from tests.integration.helpers import predict_ok, wait_for

pytestmark = pytest.mark.integration

# The spec's codes, written out here rather than imported from clipper.rpc.wire.
NEW_CONTAINER, CONTAINER_CONTENT, HEARTBEAT = 0, 1, 2
KEEP_ALIVE, REQUEST_CONTAINER_METADATA = 0, 1
PREDICT_REQUEST = 0
RPC_VERSION = 3
CODE_DOUBLES, CODE_STRINGS = 3, 4


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def read_u32(frame: bytes) -> int:
    assert len(frame) == 4, frame
    value: int = struct.unpack("<I", frame)[0]
    return value


Compute = Callable[[list[bytes]], list[str]]


class V3Container(threading.Thread):
    """An RPC v3 model container, as rpc.py behaves (heartbeats every ``heartbeat_s``)."""

    def __init__(
        self,
        port: int,
        name: str,
        version: str,
        input_code: int,
        compute: Compute,
        *,
        rpc_version: int = RPC_VERSION,
        heartbeat_s: float = 0.05,
    ) -> None:
        super().__init__(name=f"v3-container-{name}", daemon=True)
        self.address = f"tcp://127.0.0.1:{port}"
        self.model_name = name
        self.model_version = version
        self.input_code = input_code
        self.rpc_version = rpc_version
        self.compute = compute
        self.heartbeat_s = heartbeat_s
        self.stopping = threading.Event()
        self.requests: list[list[bytes]] = []  # raw predict request frames, as received
        self.heartbeat_replies: list[int] = []
        self.failure: BaseException | None = None

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)
        assert not self.is_alive()

    def run(self) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(self.address)
            sock.send_multipart([b"", u32(HEARTBEAT)])
            next_heartbeat = time.monotonic() + self.heartbeat_s
            while not self.stopping.is_set():
                if sock.poll(10):
                    self.handle(sock, sock.recv_multipart())
                if time.monotonic() >= next_heartbeat:
                    sock.send_multipart([b"", u32(HEARTBEAT)])
                    next_heartbeat = time.monotonic() + self.heartbeat_s
        except BaseException as e:  # surfaced by the test through .failure
            self.failure = e
        finally:
            sock.close(linger=0)
            ctx.term()

    def handle(self, sock: zmq.Socket[bytes], frames: list[bytes]) -> None:
        assert frames[0] == b"", frames
        assert read_u32(frames[1]) == RPC_VERSION
        mtype = read_u32(frames[2])
        if mtype == HEARTBEAT:
            kind = read_u32(frames[3])
            self.heartbeat_replies.append(kind)
            if kind == REQUEST_CONTAINER_METADATA:
                sock.send_multipart(
                    [
                        b"",
                        u32(NEW_CONTAINER),
                        self.model_name.encode(),
                        self.model_version.encode(),
                        str(self.input_code).encode("ascii"),
                        u32(self.rpc_version),
                    ]
                )
            return
        assert mtype == CONTAINER_CONTENT, mtype
        self.requests.append(list(frames))
        msg_id = frames[3]
        header = frames[6]
        n = struct.unpack_from("<Q", header, 8)[0]
        outputs = [o.encode() for o in self.compute(frames[7 : 7 + n])]
        sock.send_multipart(
            [
                b"",
                u32(CONTAINER_CONTENT),
                msg_id,
                u64(8 * (n + 1)),
                struct.pack(f"<{n + 1}Q", n, *map(len, outputs)),
                *outputs,
            ]
        )


def doubles_model(items: list[bytes]) -> list[str]:
    """Outputs exercising the frontend's "embed it if it parses as JSON" rule."""
    out = []
    for item in items:
        values = struct.unpack(f"<{len(item) // 8}d", item)
        if values[0] < 0:
            out.append("negative")  # not JSON: stays a string
        elif values[0] == 99:
            out.append(f'{{"sum": {sum(values)}, "n": {len(values)}}}')  # a JSON object
        elif values[0] == 98:
            out.append('{"__clipper_error__": "the model broke"}')  # clipper-serve's v3 error
        else:
            out.append(repr(sum(values)))  # "6.0": a JSON number
    return out


def strings_model(items: list[bytes]) -> list[str]:
    return [item.decode("utf-8").upper() for item in items]


def doubles(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}d", *values)


@pytest.fixture
def containers() -> Iterator[Callable[..., V3Container]]:
    started: list[V3Container] = []

    def start(*args: Any, **kwargs: Any) -> V3Container:
        container = V3Container(*args, **kwargs)
        container.start()
        started.append(container)
        return container

    yield start
    for container in started:
        container.stop()
        assert container.failure is None, container.failure


async def register_external(
    c: Clipper, name: str, itype: InputType, app: str, **batching: Any
) -> None:
    """A model version without an artifact: its containers are started by someone else."""
    await c.control.register_model(
        ModelVersion(
            name=name,
            version="1",
            input_type=itype,
            num_replicas=1,
            batching=BatchingConfig(**batching),
        )
    )
    await c.register_application(app, itype, "-1.0", 2_000_000)
    await c.link_model_to_app(app, name)


@pytest.fixture
async def clipper() -> AsyncIterator[Clipper]:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0, rpc_auth=False) as c:
        yield c


async def test_v3_container_serves_doubles(
    clipper: Clipper, containers: Callable[..., V3Container]
) -> None:
    c = clipper
    await register_external(
        c, "m", InputType.DOUBLES, "app", controller="fixed", max_batch_size=8, max_wait_micros=0
    )
    sched = c.schedulers[("m", "1")]
    container = containers(c.rpc.port, "m", "1", CODE_DOUBLES, doubles_model)
    await wait_for(lambda: len(sched.replicas) == 1, limit_s=10, what="the v3 container")
    replica = sched.replicas[0]
    assert replica.fast is False  # no FAST token: plain v3 framing
    assert replica.timeout == c.config.v3_replica_timeout_s

    single = await predict_ok(c.query_url, "app", {"input": [1.0, 2.0, 3.0]})
    assert single == {"query_id": single["query_id"], "output": 6.0, "default": False}

    rows = [[4.5], [-1.0, 0.0], [99.0, 1.0, 2.0]]
    batch = await predict_ok(c.query_url, "app", {"input_batch": rows})
    assert [p["output"] for p in batch["batch_predictions"]] == [
        4.5,  # "4.5" embedded as a number
        "negative",  # a plain string stays a string
        {"sum": 102.0, "n": 3},  # JSON text embedded as an object
    ]
    assert all(p["default"] is False for p in batch["batch_predictions"])

    # What the container received follows section 4.4 exactly.
    assert len(container.requests) == 2
    first, second = container.requests
    assert len(first) == 7 + 1
    assert first[:3] == [b"", u32(RPC_VERSION), u32(CONTAINER_CONTENT)]
    assert len(first[3]) == 4  # msg_id, a u32
    assert first[4] == u32(PREDICT_REQUEST)
    assert first[5] == u64(8 * (2 + 1))
    assert struct.unpack("<3Q", first[6]) == (CODE_DOUBLES, 1, 24)
    assert first[7] == doubles(1.0, 2.0, 3.0)

    n = len(rows)
    assert len(second) == 7 + n  # one frame per item
    assert second[5] == u64(8 * (2 + n))
    header = struct.unpack(f"<{2 + n}Q", second[6])
    assert header[:2] == (CODE_DOUBLES, n)
    items = second[7:]
    assert list(header[2:]) == [len(item) for item in items]  # sizes in bytes
    assert sorted(items) == sorted(doubles(*row) for row in rows)
    assert first[3] != second[3]  # each batch has its own msg_id (echoed back by the container)

    # Heartbeats: the unknown identity was asked for metadata, then kept alive.
    assert container.heartbeat_replies[0] == REQUEST_CONTAINER_METADATA
    await wait_for(
        lambda: KEEP_ALIVE in container.heartbeat_replies, limit_s=5, what="a keep-alive"
    )
    assert container.heartbeat_replies.count(REQUEST_CONTAINER_METADATA) == 1


async def test_v3_error_convention_answers_the_default(
    clipper: Clipper, containers: Callable[..., V3Container]
) -> None:
    c = clipper
    await register_external(c, "m", InputType.DOUBLES, "app")
    sched = c.schedulers[("m", "1")]
    containers(c.rpc.port, "m", "1", CODE_DOUBLES, doubles_model)
    await wait_for(lambda: len(sched.replicas) == 1, limit_s=10, what="the v3 container")
    doc = await predict_ok(c.query_url, "app", {"input": [98.0]})
    assert doc["default"] is True
    assert doc["output"] == -1.0
    assert "the model broke" in doc["default_explanation"]
    ok = await predict_ok(c.query_url, "app", {"input": [2.0, 0.5]})
    assert ok["output"] == 2.5


async def test_v3_container_serves_strings_and_json(
    clipper: Clipper, containers: Callable[..., V3Container]
) -> None:
    c = clipper
    await register_external(c, "s", InputType.STRINGS, "strings-app", max_wait_micros=0)
    await register_external(c, "j", InputType.JSON, "json-app", max_wait_micros=0)
    s = containers(c.rpc.port, "s", "1", CODE_STRINGS, strings_model)
    j = containers(c.rpc.port, "j", "1", CODE_STRINGS, lambda items: [i.decode() for i in items])
    await wait_for(
        lambda: (
            len(c.schedulers[("s", "1")].replicas) == len(c.schedulers[("j", "1")].replicas) == 1
        ),
        limit_s=10,
        what="both v3 containers",
    )

    doc = await predict_ok(c.query_url, "strings-app", {"input": "héllo"})
    assert doc["output"] == "HÉLLO"
    assert s.requests[-1][7] == "héllo".encode()  # UTF-8, no terminating NUL
    assert struct.unpack("<3Q", s.requests[-1][6]) == (CODE_STRINGS, 1, len("héllo".encode()))
    number = await predict_ok(c.query_url, "strings-app", {"input": "123"})
    assert number["output"] == 123  # the container's "123" parses as JSON

    # json inputs reach a v3 container as their canonical JSON text (keys sorted).
    echo = await predict_ok(c.query_url, "json-app", {"input": {"b": [1, 2], "a": None}})
    assert j.requests[-1][7] == b'{"a":null,"b":[1,2]}'
    assert echo["output"] == {"a": None, "b": [1, 2]}


async def test_incompatible_containers_are_not_registered(
    clipper: Clipper, containers: Callable[..., V3Container]
) -> None:
    c = clipper
    await register_external(c, "m", InputType.DOUBLES, "app")
    sched = c.schedulers[("m", "1")]
    wrong_type = containers(c.rpc.port, "m", "1", CODE_STRINGS, strings_model)
    wrong_rpc = containers(c.rpc.port, "m", "1", CODE_DOUBLES, doubles_model, rpc_version=2)
    unknown = containers(c.rpc.port, "nobody", "1", CODE_DOUBLES, doubles_model)
    # Refused metadata leaves the identity unknown: each heartbeat asks for metadata again.
    for container in (wrong_type, wrong_rpc, unknown):

        def asked_again(container: V3Container = container) -> bool:
            return container.heartbeat_replies.count(REQUEST_CONTAINER_METADATA) >= 3

        await wait_for(
            asked_again,
            limit_s=10,
            what="repeated metadata requests",
        )
    assert sched.replicas == []
    assert c.rpc.replicas() == []
    doc = await predict_ok(c.query_url, "app", {"input": [1.0]})
    assert doc["default"] is True
    assert all(not container.requests for container in (wrong_type, wrong_rpc, unknown))

    # A compatible container for the same model is taken at once.
    good = containers(c.rpc.port, "m", "1", CODE_DOUBLES, doubles_model)
    await wait_for(lambda: len(sched.replicas) == 1, limit_s=10, what="the good container")
    assert (await predict_ok(c.query_url, "app", {"input": [1.0, 1.0]}))["output"] == 2.0
    assert len(good.requests) == 1


async def test_a_silent_replica_is_removed_and_its_queries_answered_by_the_deadline(
    containers: Callable[..., V3Container],
) -> None:
    release = threading.Event()

    def hang(items: list[bytes]) -> list[str]:
        release.wait(10)  # stuck in predict: no answers, no heartbeats
        return ["0"] * len(items)

    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, v3_replica_timeout_s=1.0, rpc_auth=False
    ) as c:
        await register_external(c, "stuck", InputType.DOUBLES, "stuckapp")
        containers(c.rpc.port, "stuck", "1", CODE_DOUBLES, hang)
        sched = c.schedulers[("stuck", "1")]
        await wait_for(lambda: len(sched.replicas) == 1, what="the v3 container to register")
        loop = asyncio.get_running_loop()
        sent = loop.time()
        answer = await predict_ok(c.query_url, "stuckapp", {"input": [1.0]}, limit_s=5.0)
        elapsed = loop.time() - sent
        assert answer["default"] is True
        # The replica that held the query went silent and was removed: a replica failure,
        # not a missed SLO (docs/query-api.md), answered at the deadline all the same.
        assert answer["default_explanation"] == (
            "No replica of model stuck:1 is alive: the replica holding this query failed or "
            "left before answering"
        )
        assert 1.9 <= elapsed < 2.6  # the app's 2 s SLO, not a hang
        # removed after its 1 s of silence, well before the deadline answered the query
        assert sched.replicas == []
        release.set()
