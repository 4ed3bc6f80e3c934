"""HTTP/2 framing for the native gRPC transport: the frame types, flags and error codes of RFC
9113, the frame header, and :class:`ProtocolError` (a connection error: GOAWAY and close)."""

from __future__ import annotations

import struct

from clipper.errors import ClipperError

__all__ = [
    "ACK",
    "CANCEL",
    "COMPRESSION_ERROR",
    "CONTINUATION",
    "DATA",
    "END_HEADERS",
    "END_STREAM",
    "ENHANCE_YOUR_CALM",
    "FLOW_CONTROL_ERROR",
    "FRAME_SIZE_ERROR",
    "GOAWAY",
    "HEAD",
    "HEADERS",
    "INTERNAL_ERROR",
    "MAX_FRAME",
    "MAX_WINDOW",
    "NO_ERROR",
    "PADDED",
    "PING",
    "PREFACE",
    "PREFIX",
    "PRIORITY",
    "PRIORITY_FLAG",
    "PROTOCOL_ERROR",
    "PUSH_PROMISE",
    "REFUSED_STREAM",
    "RST_STREAM",
    "SERVICE",
    "SETTING",
    "SETTINGS",
    "U32",
    "WINDOW",
    "WINDOW_UPDATE",
    "ProtocolError",
    "frame",
]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types and flags (RFC 9113 section 6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
# Error codes.
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB

MAX_FRAME = 16_384  # what we accept: the protocol's default, so any peer respects it
WINDOW = 16 * 2**20  # each stream's receive window: a request of up to 16 MiB never waits
MAX_WINDOW = 2**31 - 1

HEAD = struct.Struct(">BHBBI")  # 24-bit length as a byte and a short, type, flags, stream id
U32 = struct.Struct(">I")
SETTING = struct.Struct(">HI")
PREFIX = struct.Struct(">BI")  # gRPC message: compressed flag, length
SERVICE = b"/inference.GRPCInferenceService/"


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return HEAD.pack(n >> 16, n & 0xFFFF, kind, flags, stream) + payload


class ProtocolError(ClipperError):
    """A connection error: answered with GOAWAY ``code`` and a close."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code
