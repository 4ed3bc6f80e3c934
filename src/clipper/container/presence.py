"""What a container tells the world about its link to the frontend: clear log lines when it
cannot reach or authenticate to it, and a readiness signal for engines to probe.

:class:`ConnectionWatch` reads a ZeroMQ socket monitor (connection refused and retried, the
CURVE handshake failing, connected) and turns it into log lines that say what is wrong and what
fixes it, at most one line per kind of trouble per :data:`REPEAT_S` (libzmq retries by itself,
with exponential backoff up to :data:`RECONNECT_MAX_MS`).

:class:`Readiness` is true while the container is registered with the frontend and its model is
loaded: ``--ready-file PATH`` exists exactly then (an exec probe: ``test -f PATH``), and
``--ready-port PORT`` answers ``GET /ready`` with 200 then and 503 otherwise (``GET /live``:
200 while the process runs).
"""

from __future__ import annotations

import contextlib
import logging
import struct
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq

if TYPE_CHECKING:
    import http.server

__all__ = [
    "RECONNECT_MAX_MS",
    "RECONNECT_MS",
    "REPEAT_S",
    "ConnectionWatch",
    "Readiness",
    "configure_reconnect",
]

# libzmq's reconnect backoff: the first retry after RECONNECT_MS, doubling up to the max.
RECONNECT_MS = 100
RECONNECT_MAX_MS = 5000
# The same trouble is logged again at most this often (with how many times it happened).
REPEAT_S = 30.0

_EVENTS = (
    zmq.EVENT_CONNECTED
    | zmq.EVENT_CONNECT_RETRIED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


def configure_reconnect(sock: zmq.Socket[bytes]) -> None:
    """Exponential reconnect backoff (libzmq's own), from RECONNECT_MS to RECONNECT_MAX_MS."""
    sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_MS)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_MAX_MS)


class ConnectionWatch:
    """The monitor of one DEALER socket; :meth:`drain` logs what happened since the last call
    (call it whenever :attr:`monitor` is readable)."""

    def __init__(
        self,
        sock: zmq.Socket[bytes],
        address: str,
        *,
        authenticated: bool,
        log: logging.Logger | logging.LoggerAdapter[logging.Logger],
        now: Any = time.monotonic,
    ) -> None:
        self.address = address
        self.authenticated = authenticated
        self.log = log
        self.now = now
        self.monitor: zmq.Socket[bytes] = sock.get_monitor_socket(_EVENTS)
        self._sock = sock
        self._last: dict[str, tuple[float, int]] = {}  # trouble -> (last logged, repeats since)
        self.troubled = False
        self.handshakes = 0

    def close(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self._sock.disable_monitor()
        self.monitor.close(linger=0)

    def drain(self) -> None:
        while True:
            try:
                frames = self.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:
                return  # closed
            if frames and len(frames[0]) >= 6:
                # libzmq's monitor frame: u16 event, u32 value (zmq.utils.monitor would pull
                # in asyncio: 20 ms of a container's start).
                self._event(struct.unpack_from("=H", frames[0])[0])

    def _event(self, event: int) -> None:
        if event == zmq.EVENT_CONNECT_RETRIED:
            self._trouble(
                "unreachable",
                "cannot reach the frontend at %s (nothing accepts connections there, or a "
                "firewall drops them); retrying with backoff up to %.0f s",
                self.address,
                RECONNECT_MAX_MS / 1000,
            )
        elif event & _HANDSHAKE_FAILED:
            if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                why = (
                    "refused this container's CURVE keys: --rpc-keys must hold this frontend's "
                    "server.key and client.key_secret (its <state dir>/rpc-keys)"
                )
            elif self.authenticated:
                why = (
                    "did not complete the CURVE handshake: --rpc-keys are another deployment's, "
                    "or the frontend runs without RPC authentication (--no-rpc-auth)"
                )
            else:
                why = (
                    "requires RPC authentication: start the container with --rpc-keys (the "
                    "frontend's <state dir>/rpc-keys)"
                )
            self._trouble("auth", "the frontend at %s %s; retrying", self.address, why)
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED or (
            event == zmq.EVENT_CONNECTED and not self.authenticated
        ):
            self.handshakes += 1
            if self.troubled:
                self.log.info("reached the frontend at %s", self.address)
                self.troubled = False
                self._last.clear()

    def _trouble(self, kind: str, msg: str, *args: object) -> None:
        self.troubled = True
        t = self.now()
        last = self._last.get(kind)
        if last is not None and t - last[0] < REPEAT_S:
            self._last[kind] = (last[0], last[1] + 1)
            return
        repeats = last[1] if last is not None else 0
        suffix = f" ({repeats} more times since the last report)" if repeats else ""
        self.log.warning(msg + suffix, *args)
        self._last[kind] = (t, 0)


class Readiness:
    """True while registered with the frontend and the model is loaded (see the module)."""

    def __init__(self, ready_file: Path | None = None, port: int | None = None,
                 host: str = "0.0.0.0") -> None:  # fmt: skip
        self.ready_file = ready_file
        self._ready = False
        self._http: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        if ready_file is not None:
            ready_file.unlink(missing_ok=True)  # a previous process's signal is not ours
        if port is not None:
            import http.server  # only when asked for: it costs a container 15 ms to import

            self._http = http.server.ThreadingHTTPServer((host, port), self._handler())
            self._http.daemon_threads = True
            self._thread = threading.Thread(
                target=self._http.serve_forever, name="clipper-ready", daemon=True
            )
            self._thread.start()

    @property
    def port(self) -> int | None:
        return None if self._http is None else int(self._http.server_address[1])

    @property
    def ready(self) -> bool:
        return self._ready

    def set(self, ready: bool) -> None:
        if ready == self._ready:
            return
        self._ready = ready
        if self.ready_file is not None:
            if ready:
                self.ready_file.parent.mkdir(parents=True, exist_ok=True)
                self.ready_file.touch()
            else:
                self.ready_file.unlink(missing_ok=True)

    def close(self) -> None:
        self.set(False)
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        import http.server

        readiness = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/live":
                    code, body = 200, b"live\n"
                elif self.path == "/ready":
                    code, body = (200, b"ready\n") if readiness.ready else (503, b"not ready\n")
                else:
                    code, body = 404, b"GET /ready or /live\n"
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # probes every few seconds: not worth a log line each

        return Handler
