"""The model-container process: load a model, connect to the frontend, serve predict batches.

Run as ``python -m clipper.container --model-path PATH --name NAME [...]`` (every flag also has
an environment variable; see ``--help``). The model file is a cloudpickle of an object with
``predict(inputs)`` or of a plain callable; a directory means ``<dir>/func.pkl`` (with
``<dir>/modules`` put on ``sys.path``) like the original closure container. ``model.setup()``
is called once, before registering, when it exists.

What ``predict`` receives:

* integers/floats/doubles: one read-only 2-D ``np.ndarray`` ``(n, d)`` when all items have the
  same length (a zero-copy view of the payload for FAST requests), else a list of 1-D arrays;
* strings: ``list[str]``; bytes: ``list[bytes]``; json: a list of decoded Python values.

It must return a list, tuple or ``np.ndarray`` with one output per input; anything else, or
an exception, fails that batch only and the container keeps serving. Each output must be JSON
(lists, dicts, strings, numbers, booleans, None, numpy arrays and scalars) with finite numbers:
an output holding a NaN or an infinity, or an object that is not JSON, fails its own input only
(:mod:`clipper.rpc.outputs`), answered with an error and never as ``null`` or the object's
``repr``.

Responses follow the request's framing. FAST (negotiated by the ``clipper-serve/fast1``
metadata frame unless ``--v3-only``): outputs as a JSON list, or status 1 with
``"ExceptionType: message"``. v3 (the original frontend, or ``--v3-only``): each output as a
string: ``str`` outputs unchanged, anything else JSON-encoded; v3 has no error channel, so a
failed batch answers every output with the JSON string ``{"__clipper_error__": "<message>"}``.

Threads: the DEALER socket belongs to the main thread, which also sends heartbeats; ``predict``
runs on one worker thread in arrival order, so heartbeats keep flowing during a slow batch.
The worker hands finished responses back through a queue and wakes the main thread's poller
with a byte on a socketpair. With no message from the frontend for ``activity_timeout`` the
container drops its socket and reconnects with a new identity (and so re-registers).

Leaving: SIGTERM (or SIGINT) drains. The container stops being ready, tells the frontend it
leaves (a goodbye message, answered by an acknowledgement after which no batch comes), answers
the batches it already holds, and exits; ``--drain-timeout`` bounds that. A second signal exits
at once. Readiness (``--ready-file``, ``--ready-port``) and the log lines about an unreachable
or refusing frontend are :mod:`clipper.container.presence`; ``--fetch-artifact`` (the model from
the frontend instead of ``--model-path``) is :mod:`clipper.container.fetch`.

Authentication: a frontend with RPC authentication on (the default) accepts only containers that
hold its deployment's CURVE keys: ``--rpc-keys DIR`` (or ``CLIPPER_RPC_KEYS``) names a directory
with ``server.key`` and ``client.key_secret`` (the frontend's ``<state dir>/rpc-keys``, or a copy
of those two files). Without it the container connects unauthenticated, which only a frontend
started with ``--no-rpc-auth`` accepts.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import orjson
import zmq

from clipper.container.fetch import ArtifactUnavailable, default_cache_dir, fetch_artifact
from clipper.container.presence import ConnectionWatch, Readiness, configure_reconnect
from clipper.errors import ConfigError, WireError
from clipper.inputs import InputType
from clipper.rpc.auth import ClientKeys, apply_client_keys, load_client_keys
from clipper.rpc.outputs import non_finite, unservable
from clipper.rpc.wire import (
    Frame,
    HeartbeatReply,
    HeartbeatType,
    PredictRequest,
    decode_frontend_message,
    encode_goodbye,
    encode_heartbeat,
    encode_new_container,
    encode_predict_error_fast,
    encode_predict_response_fast,
    encode_predict_response_partial,
    encode_predict_response_v3,
    json_default,
)

__all__ = ["ERROR_KEY", "RepeatedErrors", "decode_inputs", "load_model", "main", "serve"]

ERROR_KEY = "__clipper_error__"

_log = logging.getLogger("clipper.container")
# Upper bound on one poll, so a stop request or a dead parent is noticed quickly.
_MAX_POLL_S = 0.1
_JSON_OPTS = orjson.OPT_SERIALIZE_NUMPY


def load_model(path: str | os.PathLike[str]) -> object:
    """Load an artifact directory written by :func:`clipper.deployers.package` (it holds
    ``clipper-model.json``); else unpickle a model file, or ``<dir>/func.pkl`` for a
    closure-container directory."""
    p = Path(path)
    if p.is_dir():
        # Imported here: plain pickles need none of it.
        from clipper.deployers import MANIFEST, load

        if (p / MANIFEST).is_file():
            return load(p)
        modules = p / "modules"
        if modules.is_dir():
            sys.path.insert(0, str(modules))  # the closure's own helper modules
        p = p / "func.pkl"
    with p.open("rb") as f:
        model: object = cloudpickle.load(f)
    return model


def _predict_fn(model: object) -> Callable[[Any], Any]:
    predict = getattr(model, "predict", None)
    if callable(predict):
        return predict  # type: ignore[no-any-return]
    if callable(model):
        return model
    raise TypeError(f"model {type(model).__name__} has no predict() and is not callable")


def decode_inputs(req: PredictRequest, input_type: InputType) -> object:
    """The batch as the model sees it (see the module docstring)."""
    if req.type_name is not None:
        if req.type_name != input_type.readable:
            raise ValueError(
                f"input type mismatch: container takes {input_type.readable}, "
                f"request has {req.type_name}"
            )
    elif req.input_code != input_type.code:
        raise ValueError(
            f"input type mismatch: container takes {input_type.readable} "
            f"(code {input_type.code}), request has code {req.input_code}"
        )
    if input_type.numeric:
        dtype = np.dtype(input_type.numpy_dtype)
        if req.shape is not None:
            assert req.payload is not None
            arr = np.frombuffer(req.payload, dtype)  # a view of the received frame: no copy
            arr.flags.writeable = False
            return arr.reshape(req.shape)
        items = req.item_frames()
        for i, item in enumerate(items):
            if len(item) % dtype.itemsize:
                raise ValueError(
                    f"input {i} has {len(item)} bytes, not a multiple of {dtype.itemsize}"
                )
        sizes = {len(item) for item in items}
        if len(sizes) == 1:
            if req.payload is not None:
                flat = np.frombuffer(req.payload, dtype)
            else:
                flat = np.frombuffer(b"".join(items), dtype)
            flat.flags.writeable = False  # same contract for both framings
            return flat.reshape(len(items), -1)
        return [np.frombuffer(item, dtype) for item in items]
    items = req.item_frames()
    if input_type is InputType.STRINGS:
        return [bytes(item).decode("utf-8") for item in items]
    if input_type is InputType.JSON:
        return [orjson.loads(item) for item in items]
    return [bytes(item) for item in items]


class _Server:
    def __init__(
        self,
        model: object,
        *,
        name: str,
        version: str,
        input_type: InputType,
        address: str,
        heartbeat_interval: float,
        activity_timeout: float,
        fast: bool,
        parent_pid: int | None,
        stop_event: threading.Event,
        log: logging.LoggerAdapter[logging.Logger],
        token: str = "",
        keys: ClientKeys | None = None,
        leave_event: threading.Event | None = None,
        drain_timeout: float = 10.0,
        readiness: Readiness | None = None,
    ) -> None:
        self.token = token
        # Set on SIGTERM: drain and exit (stop_event: exit at once).
        self.leave = leave_event or threading.Event()
        self.drain_timeout = drain_timeout
        self.readiness = readiness or Readiness()
        self.watch: ConnectionWatch | None = None
        # Batches of this session received and not yet answered (main thread only).
        self.pending = 0
        self.leaving = False
        self.acked = False
        self.keys = keys
        self.model = model
        self.predict = _predict_fn(model)
        self.name, self.version, self.input_type = name, version, input_type
        self.address = address
        self.heartbeat_interval = heartbeat_interval
        self.activity_timeout = activity_timeout
        self.fast = fast
        self.parent_pid = parent_pid
        # A zombie parent still answers kill(pid, 0); being reparented is the reliable sign.
        self.parent_was_ours = parent_pid is not None and os.getppid() == parent_pid
        self.stop = stop_event
        self.log = log
        self.repeats = RepeatedErrors(log)
        # Bumped on every reconnect: results of an older session are dropped, since the
        # frontend would not know the new identity's outstanding batches anyway.
        self.session = 0
        self.jobs: queue.SimpleQueue[tuple[int, PredictRequest] | None] = queue.SimpleQueue()
        self.done: queue.SimpleQueue[tuple[int, list[bytes]]] = queue.SimpleQueue()
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)

    # -- worker thread ------------------------------------------------------------------------

    def work(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None or self.stop.is_set():
                return
            session, req = job
            if session != self.session:
                continue  # its connection is gone
            frames = self.execute(req)
            self.done.put((session, frames))
            try:
                self.wake_w.send(b"\0")
            except BlockingIOError:
                pass  # a wake-up byte is already pending
            except OSError:
                return  # the main thread has shut down

    def execute(self, req: PredictRequest) -> list[bytes]:
        fast = req.fast_meta is not None
        try:
            inputs = decode_inputs(req, self.input_type)
        except Exception as e:
            return self.error(req, fast, f"bad input: {type(e).__name__}: {e}")
        if req.labels is not None:
            return self.learn(req, inputs, req.labels)
        try:
            outputs = self.predict(inputs)
        except Exception as e:
            self.repeats.exception(e, "predict raised on a batch of %d", req.n)
            return self.error(req, fast, f"{type(e).__name__}: {e}")
        problem = _check_outputs(outputs, req.n)
        if problem is not None:
            self.log.error("%s", problem)
            return self.error(req, fast, problem)
        if fast:
            return self.encode_fast(req, outputs)
        return self.encode_v3(req, outputs)

    def encode_fast(self, req: PredictRequest, outputs: Any) -> list[bytes]:
        """The outputs, or each one that cannot be served as its input's error: an object that
        is not JSON, or a NaN or infinity (which orjson would send as ``null``)."""
        try:
            frames = encode_predict_response_fast(req.msg_id_bytes, outputs)
        except (orjson.JSONEncodeError, TypeError):
            problems = unservable(outputs, _encode)
        else:
            if b"null" not in frames[-1]:
                return frames  # the common case: no NaN can hide in it, one scan of the body
            problems = unservable(outputs, _encode)
            if not problems:
                return frames  # a None (or "null" in a string), not a NaN
        self.repeats.note_outputs(problems, req.n)
        return encode_predict_response_partial(req.msg_id_bytes, list(outputs), problems)

    def encode_v3(self, req: PredictRequest, outputs: Any) -> list[bytes]:
        """v3: each output a string; one that cannot be served is the error marker instead."""
        strings: list[bytes | str] = []
        problems: dict[int, str] = {}
        for i, o in enumerate(outputs):
            try:
                text = _v3_output(o)
            except (orjson.JSONEncodeError, TypeError) as e:
                problems[i] = f"output is not JSON: {e}"
                text = ""
            else:
                bad = None if isinstance(text, str) or b"null" not in text else non_finite(o)
                if bad is not None:
                    problems[i] = f"output contains {bad} (JSON has no such number)"
            strings.append(orjson.dumps({ERROR_KEY: problems[i]}) if i in problems else text)
        if problems:
            self.repeats.note_outputs(problems, req.n)
        return encode_predict_response_v3(req.msg_id_bytes, strings)

    def learn(self, req: PredictRequest, inputs: Any, labels: list[Any]) -> list[bytes]:
        """Online learning: hand feedback to the model's update(inputs, labels)."""
        update = getattr(self.model, "update", None)
        if not callable(update):
            return self.error(req, True, "the model has no update(inputs, labels) method")
        try:
            update(inputs, labels)
        except Exception as e:
            self.repeats.exception(e, "update raised on %d labelled inputs", req.n)
            return self.error(req, True, f"{type(e).__name__}: {e}")
        return encode_predict_response_fast(req.msg_id_bytes, [])

    def error(self, req: PredictRequest, fast: bool, message: str) -> list[bytes]:
        if fast:
            return encode_predict_error_fast(req.msg_id_bytes, message)
        self.log.error("batch failed (v3 has no error channel): %s", message)
        err = orjson.dumps({ERROR_KEY: message})
        return encode_predict_response_v3(req.msg_id_bytes, [err] * req.n)

    # -- main thread --------------------------------------------------------------------------

    def run(self) -> None:
        worker = threading.Thread(target=self.work, name="clipper-predict", daemon=True)
        worker.start()
        ctx = zmq.Context()
        sock = self.connect(ctx)
        try:
            self.loop(ctx, sock)
        finally:
            self.readiness.set(False)
            if self.watch is not None:
                self.watch.close()
            self.stop.set()
            self.jobs.put(None)
            self.wake_r.close()
            self.wake_w.close()  # a worker still inside predict() finds it closed and exits
            ctx.destroy(linger=0)

    def connect(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        configure_reconnect(sock)
        if self.keys is not None:
            apply_client_keys(sock, self.keys)
        if self.watch is not None:
            self.watch.close()
        self.watch = ConnectionWatch(
            sock, self.address, authenticated=self.keys is not None, log=self.log
        )
        sock.connect(self.address)
        sock.send_multipart(encode_heartbeat())  # ZeroMQ queues it until the frontend is up
        self.log.info("connecting to %s", self.address)
        return sock

    def loop(self, ctx: zmq.Context[zmq.Socket[bytes]], sock: zmq.Socket[bytes]) -> None:
        now = time.monotonic()
        last_rx = now
        next_hb = now + self.heartbeat_interval
        connected = False  # like rpc.py: periodic heartbeats only once the frontend answered
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        wake_fd = self.wake_r.fileno()  # zmq.Poller reports plain sockets by fd
        poller.register(wake_fd, zmq.POLLIN)
        assert self.watch is not None
        poller.register(self.watch.monitor, zmq.POLLIN)
        leave_by = 0.0
        while not self.stop.is_set():
            if self.parent_gone():
                self.log.warning("parent process %s is gone; exiting", self.parent_pid)
                return
            now = time.monotonic()
            if self.leave.is_set() and not self.leaving:
                self.leaving = True
                leave_by = now + self.drain_timeout
                self.readiness.set(False)
                if connected and self.fast:
                    sock.send_multipart(encode_goodbye())
                    self.log.info("leaving: told the frontend; draining %d batches", self.pending)
                else:
                    self.acked = True  # nothing to tell: not connected, or the original frontend
            if self.leaving:
                if self.acked and self.pending == 0:
                    self.log.info("drained; exiting")
                    break
                if now >= leave_by:
                    self.log.warning(
                        "drain timeout (%.1f s): exiting with %d batches unanswered",
                        self.drain_timeout, self.pending,
                    )  # fmt: skip
                    break
            wait = min(_MAX_POLL_S, last_rx + self.activity_timeout - now)
            if connected:
                wait = min(wait, next_hb - now)
            events = dict(poller.poll(max(0, int(wait * 1000))))
            if self.watch.monitor in events:
                self.watch.drain()
            if sock in events:
                # Bounded, so a flood of requests cannot starve heartbeats and responses.
                for _ in range(256):
                    try:
                        parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    last_rx = time.monotonic()
                    if not connected:
                        connected = True
                        next_hb = last_rx + self.heartbeat_interval
                    self.handle(sock, [p.buffer for p in parts])
            if wake_fd in events:
                self.flush(sock)
            now = time.monotonic()
            if connected and now >= next_hb:
                sock.send_multipart(encode_heartbeat())
                next_hb = now + self.heartbeat_interval
            if now - last_rx >= self.activity_timeout:
                self.log.warning(
                    "no message from the frontend for %.1fs; reconnecting%s",
                    now - last_rx,
                    ""
                    if connected
                    else (
                        " (never answered: are --rpc-keys those of this frontend?)"
                        if self.keys is not None
                        else " (never answered: a frontend with RPC authentication on needs "
                        "--rpc-keys)"
                    ),
                )
                poller.unregister(sock)
                poller.unregister(self.watch.monitor)
                sock.close(linger=0)
                self.session += 1
                self.pending = 0  # that session's batches are dropped
                self.readiness.set(False)
                sock = self.connect(ctx)
                poller.register(sock, zmq.POLLIN)
                poller.register(self.watch.monitor, zmq.POLLIN)
                last_rx = now
                connected = False
                if self.leaving:
                    break  # the frontend is gone: nobody waits for our answers
        self.repeats.flush()
        self.log.info("stopping")
        sock.close(linger=0)

    def handle(self, sock: zmq.Socket[bytes], frames: list[Frame]) -> None:
        try:
            msg = decode_frontend_message(frames)
        except WireError as e:
            self.log.warning("dropping a malformed message: %s", e)
            return
        if isinstance(msg, HeartbeatReply):
            if msg.type == HeartbeatType.GOODBYE_ACK:
                self.acked = True
            elif self.leaving:
                pass  # removed as it drained: it must not register again
            elif msg.type == HeartbeatType.KEEP_ALIVE:
                self.readiness.set(True)  # known to the frontend: registered
            elif msg.type == HeartbeatType.REQUEST_CONTAINER_METADATA:
                self.readiness.set(False)
                sock.send_multipart(
                    encode_new_container(
                        self.name,
                        self.version,
                        self.input_type.code,
                        fast=self.fast,
                        token=self.token,
                    )
                )
                self.log.info("sent metadata (fast=%s)", self.fast)
            return
        if not isinstance(msg, PredictRequest):
            return  # an artifact chunk: for a fetch, never for the serving connection
        self.pending += 1
        self.jobs.put((self.session, msg))

    def flush(self, sock: zmq.Socket[bytes]) -> None:
        try:
            while self.wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                session, frames = self.done.get_nowait()
            except queue.Empty:
                return
            if session == self.session:
                self.pending -= 1
                sock.send_multipart(frames, copy=False)

    def parent_gone(self) -> bool:
        if self.parent_pid is None:
            return False
        if self.parent_was_ours and os.getppid() != self.parent_pid:
            return True
        try:
            os.kill(self.parent_pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False  # exists, owned by someone else
        return False


def _check_outputs(outputs: object, n: int) -> str | None:
    if isinstance(outputs, np.ndarray):
        if outputs.ndim == 0:
            return f"predict returned a 0-d array for {n} inputs"
    elif not isinstance(outputs, list | tuple):
        return (
            f"predict returned {type(outputs).__name__}; expected a list, tuple or numpy array "
            f"of {n} outputs"
        )
    if len(outputs) != n:
        return f"predict returned {len(outputs)} outputs for {n} inputs"
    return None


def _encode(o: object) -> bytes:
    return orjson.dumps(o, option=_JSON_OPTS, default=json_default)


def _v3_output(o: object) -> bytes | str:
    if isinstance(o, str):
        return o
    return orjson.dumps(o, option=_JSON_OPTS, default=json_default)


def serve(
    model: object,
    *,
    name: str,
    version: str,
    input_type: InputType,
    address: str,
    heartbeat_interval: float = 1.0,
    activity_timeout: float = 10.0,
    fast: bool = True,
    parent_pid: int | None = None,
    stop_event: threading.Event | None = None,
    token: str = "",
    keys: ClientKeys | None = None,
    leave_event: threading.Event | None = None,
    drain_timeout: float = 10.0,
    readiness: Readiness | None = None,
) -> None:
    """Serve ``model`` to the frontend at ``address`` until ``stop_event`` is set (or the
    parent process is gone), or drain and return once ``leave_event`` is set. Runs
    ``model.setup()`` first when it exists. ``keys``: this deployment's CURVE keys
    (:func:`clipper.rpc.auth.load_client_keys`), None for a frontend without RPC
    authentication. ``readiness`` is set while the container is registered."""
    log = _Prefixed(_log, {"prefix": f"[{name}:{version} pid={os.getpid()}]"})
    setup = getattr(model, "setup", None)
    if callable(setup):
        setup()
    # Before registering, so a replica that cannot answer never reports ready: the model file's
    # declared input against this version's input type, and a smoke prediction.
    from clipper.deployers import check  # in-function: plain pickled models need none of it

    check(model, input_type=input_type)
    # The loaded model and its framework live as long as the process: keep them out of the
    # cyclic collector, whose full passes over them stall a batch for tens of milliseconds.
    gc.collect()
    gc.freeze()
    _Server(
        model,
        name=name,
        version=version,
        input_type=input_type,
        address=address,
        heartbeat_interval=heartbeat_interval,
        activity_timeout=activity_timeout,
        fast=fast,
        parent_pid=parent_pid,
        stop_event=stop_event or threading.Event(),
        log=log,
        token=token,
        keys=keys,
        leave_event=leave_event,
        drain_timeout=drain_timeout,
        readiness=readiness,
    ).run()


class RepeatedErrors:
    """One traceback per kind of failure, then a count: a model that fails every batch the
    same way (a bad-shape query sent in a loop) would otherwise write a traceback per batch
    (0.6 MB/s). A kind is the exception's type and the line that raised it; its first
    occurrence is logged in full, the repeats within ``window_s`` are counted and summed up
    as "... and 4,211 more like it" when the window is over (at the next one, or at exit)."""

    def __init__(
        self,
        log: logging.LoggerAdapter[logging.Logger] | logging.Logger,
        *,
        window_s: float = 60.0,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = log
        self.window_s = window_s
        self.now = now
        self._kinds: dict[tuple[str, str], list[float]] = {}  # kind -> [window start, count]

    @staticmethod
    def kind(exc: BaseException) -> tuple[str, str]:
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        where = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else ""
        return type(exc).__name__, where

    def exception(self, exc: BaseException, msg: str, *args: object) -> None:
        """Log ``msg`` with ``exc``'s traceback, or count it when its kind was just logged."""
        if self._first(self.kind(exc)):
            self.log.error(msg, *args, exc_info=exc)

    def note_outputs(self, problems: dict[int, str], n: int) -> None:
        """Outputs that cannot be served (no traceback: predict returned); a kind per reason."""
        first = next(iter(problems.values()))
        if self._first(("unservable output", first.split(":")[0])):
            self.log.error(
                "predict returned %d of %d outputs that cannot be served; the first: %s",
                len(problems), n, first[:300],
            )  # fmt: skip

    def _first(self, key: tuple[str, str]) -> bool:
        """True when ``key`` is to be logged now, False when counted as a repeat."""
        t = self.now()
        seen = self._kinds.get(key)
        if seen is not None and t - seen[0] < self.window_s:
            seen[1] += 1
            return False
        if seen is not None:
            self._summary(key, seen)
        self._kinds[key] = [t, 0]
        return True

    def flush(self) -> None:
        """The counts not yet reported (at exit)."""
        for key, seen in self._kinds.items():
            self._summary(key, seen)
        self._kinds.clear()

    def _summary(self, key: tuple[str, str], seen: list[float]) -> None:
        if seen[1]:
            self.log.error(
                "... and %s more like it (%s at %s) in %.0f s",
                f"{int(seen[1]):,}",
                key[0],
                key[1],
                min(self.now() - seen[0], self.window_s),
            )


class _Prefixed(logging.LoggerAdapter[logging.Logger]):
    """Prefixes every record with ``[name:version pid=N]`` (several containers share a log)."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        prefix = self.extra["prefix"] if self.extra else ""
        return f"{prefix} {msg}", kwargs


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def _flag(name: str) -> bool:
    return (_env(name, "") or "").lower() in ("1", "true", "yes")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m clipper.container",
        description="Serve a cloudpickled model to a clipper-serve (or Clipper) frontend.",
    )
    name = _env("CLIPPER_MODEL_NAME")
    p.add_argument(
        "--model-path",
        default=_env("CLIPPER_MODEL_PATH"),
        help="cloudpickle file, or a directory holding func.pkl; or --fetch-artifact "
        "[CLIPPER_MODEL_PATH]",
    )
    p.add_argument(
        "--fetch-artifact",
        action="store_true",
        default=_flag("CLIPPER_FETCH_ARTIFACT"),
        help="fetch the model version's artifact from the frontend (checksummed, cached in "
        "--cache-dir) instead of reading --model-path [CLIPPER_FETCH_ARTIFACT]",
    )
    p.add_argument(
        "--cache-dir",
        default=_env("CLIPPER_CACHE_DIR"),
        help="where fetched artifacts are kept, by checksum (default: "
        "~/.cache/clipper-serve/artifacts) [CLIPPER_CACHE_DIR]",
    )
    p.add_argument(
        "--ready-file",
        default=_env("CLIPPER_READY_FILE"),
        help="exists while the model is loaded and the container registered with the "
        "frontend (a readiness probe: test -f) [CLIPPER_READY_FILE]",
    )
    p.add_argument(
        "--ready-port",
        type=int,
        default=int(_env("CLIPPER_READY_PORT", "0") or 0) or None,
        help="serve GET /ready (200 or 503) and GET /live on this port [CLIPPER_READY_PORT]",
    )
    p.add_argument(
        "--ready-host",
        default=_env("CLIPPER_READY_HOST", "0.0.0.0"),
        help="address of --ready-port (default 0.0.0.0) [CLIPPER_READY_HOST]",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=float(_env("CLIPPER_DRAIN_TIMEOUT", "10") or 10),
        help="on SIGTERM, answer the batches held for at most this many seconds, then exit "
        "[CLIPPER_DRAIN_TIMEOUT]",
    )
    p.add_argument("--name", default=name, required=name is None, help="[CLIPPER_MODEL_NAME]")
    p.add_argument(
        "--version", default=_env("CLIPPER_MODEL_VERSION", "1"), help="[CLIPPER_MODEL_VERSION]"
    )
    p.add_argument(
        "--input-type",
        default=_env("CLIPPER_INPUT_TYPE", "doubles"),
        help="bytes, integers, floats, doubles, strings or json [CLIPPER_INPUT_TYPE]",
    )
    p.add_argument("--ip", default=_env("CLIPPER_IP", "127.0.0.1"), help="[CLIPPER_IP]")
    p.add_argument(
        "--port", type=int, default=int(_env("CLIPPER_PORT", "7000") or 7000), help="[CLIPPER_PORT]"
    )
    p.add_argument(
        "--heartbeat-interval",
        type=float,
        default=float(_env("CLIPPER_HEARTBEAT_INTERVAL", "1.0") or 1.0),
        help="seconds between heartbeats [CLIPPER_HEARTBEAT_INTERVAL]",
    )
    p.add_argument(
        "--activity-timeout",
        type=float,
        default=float(_env("CLIPPER_ACTIVITY_TIMEOUT", "10") or 10),
        help="reconnect after this many seconds without a message [CLIPPER_ACTIVITY_TIMEOUT]",
    )
    p.add_argument(
        "--v3-only",
        action="store_true",
        default=_flag("CLIPPER_V3_ONLY"),
        help="do not advertise the FAST framing [CLIPPER_V3_ONLY]",
    )
    parent = _env("CLIPPER_PARENT_PID")
    p.add_argument(
        "--parent-pid",
        type=int,
        default=int(parent) if parent else None,
        help="exit when this process is gone [CLIPPER_PARENT_PID]",
    )
    p.add_argument(
        "--replica-token",
        default=_env("CLIPPER_REPLICA_TOKEN", "") or "",
        help="opaque slot token sent with the metadata (set by the local manager) "
        "[CLIPPER_REPLICA_TOKEN]",
    )
    p.add_argument(
        "--rpc-keys",
        default=_env("CLIPPER_RPC_KEYS"),
        help="directory with the frontend's server.key and client.key_secret (its "
        "<state dir>/rpc-keys); needed unless the frontend runs --no-rpc-auth [CLIPPER_RPC_KEYS]",
    )
    p.add_argument(
        "--nice",
        type=int,
        default=int(_env("CLIPPER_NICE", "0") or 0),
        help="lower this process's CPU priority by this much [CLIPPER_NICE]",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if (args.model_path is None) == (not args.fetch_artifact):
        parser.error("give exactly one of --model-path and --fetch-artifact")
    if args.nice > 0:
        os.nice(args.nice)
    try:
        input_type = InputType.parse(args.input_type)
    except ValueError as e:
        print(f"error: --input-type: {e}", file=sys.stderr)
        return 2
    try:
        keys = load_client_keys(Path(args.rpc_keys)) if args.rpc_keys else None
    except ConfigError as e:
        print(f"error: --rpc-keys: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    stop = threading.Event()
    leave = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if leave.is_set():
            _log.info("signal %d again: exiting now", signum)
            stop.set()
        else:
            _log.info("signal %d: draining, then exiting", signum)
            leave.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    address = f"tcp://{args.ip}:{args.port}"
    readiness: Readiness | None = None
    try:
        readiness = Readiness(
            Path(args.ready_file) if args.ready_file else None, args.ready_port, args.ready_host
        )
        model_path = args.model_path
        if args.fetch_artifact:
            prefixed = _Prefixed(
                _log, {"prefix": f"[{args.name}:{args.version} pid={os.getpid()}]"}
            )
            model_path = fetch_artifact(
                address=address,
                keys=keys,
                name=args.name,
                version=args.version,
                cache_dir=Path(args.cache_dir) if args.cache_dir else default_cache_dir(),
                stop=leave,
                log=prefixed,
            )
        model = load_model(model_path)
        serve(
            model,
            name=args.name,
            version=args.version,
            input_type=input_type,
            address=address,
            heartbeat_interval=args.heartbeat_interval,
            activity_timeout=args.activity_timeout,
            fast=not args.v3_only,
            parent_pid=args.parent_pid,
            stop_event=stop,
            token=args.replica_token,
            keys=keys,
            leave_event=leave,
            drain_timeout=args.drain_timeout,
            readiness=readiness,
        )
    except ArtifactUnavailable:
        return 0  # told to leave while fetching
    except ConfigError as e:  # the model refused at load: one line, it says what to fix
        _log.error("[%s:%s pid=%d] model refused: %s", args.name, args.version, os.getpid(), e)
        return 2
    except Exception:
        _log.exception("[%s:%s pid=%d] container failed", args.name, args.version, os.getpid())
        return 1
    finally:
        if readiness is not None:
            readiness.close()
    return 0
