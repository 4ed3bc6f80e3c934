"""HPACK for the native gRPC transport: the header blocks we send and the ones we decode.

What we send is constant (literals without indexing, :func:`header_block`), so responses need
no encoder state beyond one thing a peer may ask for: a smaller dynamic table
(SETTINGS_HEADER_TABLE_SIZE), which RFC 7541 section 4.2 says we acknowledge with a size update
at the start of our next block (:func:`table_size_update`).

What we decode goes through :class:`HeaderCache`: a block is first judged without decoding it
(its encoded size, and :func:`count_headers` walks its representations without Huffman
decoding, stopping past the limit), then decoded by :class:`hpack.Decoder` with a decoded-size
cap, and small blocks are remembered by (table generation, bytes), since a client repeats the
same blocks. See docs/security.md, "HTTP/2 (the gRPC port)".
"""

from __future__ import annotations

from collections.abc import Sequence

import hpack

from clipper.errors import ClipperError

__all__ = [
    "CACHE_BLOCK_BYTES",
    "CACHE_BYTES",
    "CACHE_ENTRIES",
    "CALL_METADATA",
    "MAX_HEADERS",
    "MAX_HEADER_LIST",
    "HeaderCache",
    "HeaderLimitError",
    "count_headers",
    "error_block",
    "error_metadata",
    "header_block",
    "table_size_update",
]

# gRPC's own metadata limit is 8-16 KiB; a request's headers are a few hundred bytes.
MAX_HEADER_LIST = 16 * 1024  # decoded, as RFC 7541 counts it (name + value + 32 per header)
MAX_HEADERS = 128  # header fields per block, counted before decoding
CACHE_BLOCK_BYTES = 1024  # only blocks this small are cached: a client's repeated requests
CACHE_BYTES = 32 * 1024  # cached block bytes per connection (the cache is cleared beyond)
CACHE_ENTRIES = 512
# The metadata a call's handler is given (the tenant gate's: docs/tenants.md; the W3C trace
# context: docs/tracing.md); the rest is not kept.
CALL_METADATA = frozenset((b"authorization", b"x-api-key", b"x-priority", b"traceparent"))
# (:path, content-type, the call's CALL_METADATA entries)
Decoded = tuple[bytes, bytes, dict[bytes, bytes]]


class HeaderLimitError(ClipperError):
    """A header block over one of our limits (not malformed): the connection is told to calm
    down (GOAWAY ENHANCE_YOUR_CALM)."""


def _int(value: int, prefix: int, first: int) -> bytes:
    """An HPACK integer with a ``prefix``-bit prefix, ``first`` the bits above it."""
    top = (1 << prefix) - 1
    if value < top:
        return bytes([first | value])
    out = bytearray([first | top])
    value -= top
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def header_block(headers: list[tuple[bytes, bytes]]) -> bytes:
    """An HPACK block of literals without indexing (new names, no Huffman): constant, and it
    leaves the peer's dynamic table alone, so responses need no encoder state."""
    out = bytearray()
    for name, value in headers:
        if name == b":status" and value == b"200":
            out.append(0x88)  # static table entry 8
            continue
        out += b"\x00" + _int(len(name), 7, 0) + name + _int(len(value), 7, 0) + value
    return bytes(out)


def table_size_update(size: int) -> bytes:
    """A dynamic table size update (RFC 7541 section 6.3): what starts the first block we send
    after a peer lowered SETTINGS_HEADER_TABLE_SIZE."""
    return _int(size, 5, 0x20)


def _percent(message: str) -> bytes:
    """grpc-message's percent-encoding: printable ASCII but '%' stays as it is."""
    raw = message.encode()[:4096]  # an error block must fit one frame
    return b"".join(bytes([c]) if 0x20 <= c <= 0x7E and c != 0x25 else b"%%%02X" % c for c in raw)


_OK_HEAD = header_block([(b":status", b"200"), (b"content-type", b"application/grpc")])


def error_block(code: int, message: str, metadata: Sequence[tuple[bytes, bytes]] = ()) -> bytes:
    """A trailers-only response's header block: an error and no message; ``metadata``: its
    trailing metadata (a refused tenant's ``retry-after`` and RateLimit fields)."""
    return _OK_HEAD + header_block(
        [(b"grpc-status", str(code).encode()), (b"grpc-message", _percent(message)), *metadata]
    )


def error_metadata(headers: bytes) -> list[tuple[bytes, bytes]]:
    """An error's extra HTTP header lines (``Name: value\r\n``, :class:`RequestError`'s
    ``headers``) as gRPC metadata: lower-case names, the same values."""
    out: list[tuple[bytes, bytes]] = []
    for line in headers.split(b"\r\n"):
        name, sep, value = line.partition(b":")
        if sep:
            out.append((name.strip().lower(), value.strip()))
    return out


def _skip_int(block: bytes, pos: int, prefix: int) -> int:
    """The position after an HPACK integer that starts at ``pos``; -1 if the block ends first."""
    n = len(block)
    if pos >= n:
        return -1
    top = (1 << prefix) - 1
    if block[pos] & top != top:
        return pos + 1
    pos += 1
    while pos < n:
        if not block[pos] & 0x80:
            return pos + 1
        pos += 1
    return -1


def _skip_string(block: bytes, pos: int) -> int:
    """The position after an HPACK string literal (not Huffman-decoded); -1 if cut short."""
    n = len(block)
    if pos >= n:
        return -1
    top = 0x7F
    length = block[pos] & top
    pos += 1
    if length == top:  # a multi-byte length
        shift = 0
        while True:
            if pos >= n or shift > 28:
                return -1
            b = block[pos]
            pos += 1
            length += (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
    end = pos + length
    return end if end <= n else -1


def count_headers(block: bytes, limit: int = MAX_HEADERS) -> int:
    """How many header fields ``block`` holds, walking its representations without decoding
    them (no Huffman, no table): a few hundred nanoseconds per field, and it stops once past
    ``limit`` (returning ``limit + 1``). A malformed block is left to the decoder to refuse."""
    pos, n, count = 0, len(block), 0
    while pos < n:
        b = block[pos]
        if b & 0x80:  # indexed field
            pos = _skip_int(block, pos, 7)
        elif b & 0xE0 == 0x20:  # dynamic table size update: not a field
            pos = _skip_int(block, pos, 5)
            count -= 1
        else:  # a literal: with incremental indexing (6-bit index) or without (4-bit)
            index_bits = 6 if b & 0x40 else 4
            has_name = b & ((1 << index_bits) - 1)
            pos = _skip_int(block, pos, index_bits)
            if pos >= 0 and not has_name:
                pos = _skip_string(block, pos)
            if pos >= 0:
                pos = _skip_string(block, pos)
        if pos < 0:
            return count + 1  # cut short: the decoder says what is wrong with it
        count += 1
        if count > limit:
            return count
    return count


class HeaderCache:
    """Decoded request header blocks by (table generation, bytes). A block is cached only if
    it is small and decoding it left the dynamic table as it was; a block that changed it
    bumps the generation, so no cached block can be replayed against a table it was not
    decoded with. :meth:`decode` raises :class:`HeaderLimitError` for a block over our limits
    and hpack's errors for a malformed one."""

    __slots__ = ("_bytes", "_cache", "decoder", "generation", "max_headers")

    def __init__(self, *, max_list: int = MAX_HEADER_LIST, max_headers: int = MAX_HEADERS) -> None:
        self.decoder = hpack.Decoder(max_header_list_size=max_list)
        self.max_headers = max_headers
        self.generation = 0
        self._cache: dict[tuple[int, bytes], Decoded] = {}
        self._bytes = 0

    def _state(self) -> tuple[object, int, int, int]:
        table = self.decoder.header_table
        entries = table.dynamic_entries
        # The newest entry itself (held, so its id cannot be reused): any insert replaces it.
        return (entries[0] if entries else None, len(entries), table._current_size, table.maxsize)

    def cached(self, block: bytes) -> tuple[bytes, bytes] | None:
        """What an earlier decode of these very bytes gave, if it still holds."""
        hit = self._cache.get((self.generation, block))
        return None if hit is None else hit[:2]

    def decode(self, block: bytes) -> tuple[bytes, bytes]:
        """``(:path, content-type)`` of a header block."""
        path, ctype, _ = self.decode_call(block)
        return path, ctype

    def decode_call(self, block: bytes) -> Decoded:
        """``(:path, content-type, metadata)`` of a header block; ``metadata``: the call's
        :data:`CALL_METADATA` entries (its API key and priority, for the tenant gate)."""
        key = (self.generation, block)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if count_headers(block, self.max_headers) > self.max_headers:
            raise HeaderLimitError(
                f"a header block of more than {self.max_headers} fields (MAX_HEADERS)"
            )
        before = self._state()
        try:
            headers = self.decoder.decode(block, raw=True)
        except hpack.OversizedHeaderListError as e:
            raise HeaderLimitError(
                f"a header list over {self.decoder.max_header_list_size} bytes decoded "
                "(MAX_HEADER_LIST)"
            ) from e
        after = self._state()
        path = ctype = b""
        meta: dict[bytes, bytes] = {}
        for name, value in headers:
            if name == b":path":
                path = bytes(value)
            elif name == b"content-type":
                ctype = bytes(value)
            elif name in CALL_METADATA:
                # A repeated entry joins with a comma, as HTTP/1.1 joins a repeated header.
                old = meta.get(name)
                meta[name] = value if old is None else old + b"," + value
        got = (path, ctype, meta)
        if before[0] is after[0] and before[1:] == after[1:]:
            if len(block) <= CACHE_BLOCK_BYTES:
                if len(self._cache) >= CACHE_ENTRIES or self._bytes + len(block) > CACHE_BYTES:
                    self._cache.clear()
                    self._bytes = 0
                self._cache[key] = got
                self._bytes += len(block)
        else:
            self.generation += 1
        return got

    @property
    def cached_bytes(self) -> int:
        """Block bytes the cache holds (bounded by :data:`CACHE_BYTES`)."""
        return self._bytes
