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

Threads: the DEALER sockets, one per frontend (:mod:`clipper.container.link`), belong to the
main thread, which also sends heartbeats; ``predict`` runs on one worker thread in arrival order
across every frontend, so heartbeats keep flowing during a slow batch. The worker hands finished
responses back through a queue, each tagged with the link and session its batch came on, and
wakes the main thread's poller with a byte on a socketpair. With no message from a frontend for
``activity_timeout`` the container drops that link's socket and reconnects with a new identity
(and so re-registers there).

Shared replicas (``--shared``, ``--frontend``): the container serves every frontend of a
deployment. It follows the FRONTENDS lists the frontends send (dialling new addresses, dropping
unlisted ones but never its last live link), reports its queue after each heartbeat, ignores
``--parent-pid``, and exits once no frontend was heard from for ``--orphan-timeout-s``. A
frontend on this machine is dialled on its private Unix socket (:mod:`clipper.container.dial`).

Leaving: SIGTERM (or SIGINT, or a RETIRE message) drains. The container stops being ready,
tells every frontend it leaves (a goodbye message, answered by an acknowledgement after which
no batch comes), answers the batches it already holds, and exits; ``--drain-timeout`` bounds
that. A second signal exits at once. Readiness (``--ready-file``, ``--ready-port``) and the log
lines about an unreachable or refusing frontend are :mod:`clipper.container.presence`;
``--fetch-artifact`` (the model from the frontend instead of ``--model-path``) is
:mod:`clipper.container.fetch`; ``--pool`` (many models in one process, loaded on demand) is
:mod:`clipper.container.pool`.

Authentication: a frontend with RPC authentication on (the default) accepts only containers that
hold its deployment's CURVE keys: ``--rpc-keys DIR`` (or ``CLIPPER_RPC_KEYS``) names a directory
with ``server.key`` and ``client.key_secret`` (the frontend's ``<state dir>/rpc-keys``, or a copy
of those two files). Without it the container connects unauthenticated, which only a frontend
started with ``--no-rpc-auth`` accepts.
"""

from __future__ import annotations

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

import numpy as np
import orjson
import zmq

from clipper.container.dial import DialPlan
from clipper.container.fetch import ArtifactUnavailable, default_cache_dir, fetch_artifact
from clipper.container.link import FrontendLink
from clipper.container.options import build_parser, frontends_from
from clipper.container.predict_trace import PredictTraces, predict_traces
from clipper.container.presence import Readiness
from clipper.errors import ConfigError, WireError
from clipper.inputs import InputType
from clipper.rpc.auth import ClientKeys, load_client_keys
from clipper.rpc.outputs import non_finite, unservable
from clipper.rpc.wire import (
    LOCAL_SOCKETS_FEATURE,
    MAX_FRONTENDS,
    Frame,
    Frontends,
    HeartbeatReply,
    HeartbeatType,
    LocalSockets,
    PredictRequest,
    Retire,
    decode_frontend_message,
    encode_goodbye,
    encode_heartbeat,
    encode_new_container,
    encode_predict_error_fast,
    encode_predict_response_fast,
    encode_predict_response_partial,
    encode_predict_response_v3,
    encode_queue_report,
    json_default,
)

__all__ = [
    "ERROR_KEY",
    "RepeatedErrors",
    "decode_inputs",
    "load_model",
    "main",
    "serve",
    "start_process",
]

ERROR_KEY = "__clipper_error__"

_log = logging.getLogger("clipper.container")
# Upper bound on one poll, so a stop request or a dead parent is noticed quickly.
_MAX_POLL_S = 0.1
# At most this many frontends at once (the --ip/--port one and a full FRONTENDS list).
_MAX_LINKS = MAX_FRONTENDS + 1
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
    import cloudpickle  # here: only a plain pickle needs it (~20 ms of a cold start)

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
        addresses: Sequence[str],
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
        shared: bool = False,
        orphan_timeout: float = 60.0,
        traces: PredictTraces | None = None,
    ) -> None:
        self.token = token
        self.traces = traces  # None: tracing off (the OTEL_* variables ask for none)
        # Set on SIGTERM: drain and exit (stop_event: exit at once).
        self.leave = leave_event or threading.Event()
        self.drain_timeout = drain_timeout
        self.readiness = readiness or Readiness()
        # One link per frontend address (main thread only), dialled in run().
        self.addresses = list(dict.fromkeys(addresses))
        self.links: dict[str, FrontendLink] = {}
        self.dial = DialPlan()  # the frontends' Unix sockets (LOCAL_SOCKETS), when shared
        self.ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self.poller: zmq.Poller | None = None
        self.shared = shared
        self.orphan_timeout = orphan_timeout
        self.heard_at = 0.0  # when any frontend was last heard from, on any link
        self.leaving = False
        self.leave_by = 0.0
        self.keys = keys
        self.model = model
        self.predict = _predict_fn(model)
        self.name, self.version, self.input_type = name, version, input_type
        self.heartbeat_interval = heartbeat_interval
        self.activity_timeout = activity_timeout
        self.fast = fast
        self.parent_pid = parent_pid
        # A zombie parent still answers kill(pid, 0); being reparented is the reliable sign.
        self.parent_was_ours = parent_pid is not None and os.getppid() == parent_pid
        self.stop = stop_event
        self.log = log
        self.repeats = RepeatedErrors(log)
        # One FIFO for every link: batches run in arrival order across frontends; each is
        # tagged with its link and that link's session, so its answer goes back on it.
        self.jobs: queue.SimpleQueue[tuple[FrontendLink, int, PredictRequest] | None] = (
            queue.SimpleQueue()
        )
        self.done: queue.SimpleQueue[tuple[FrontendLink, int, list[bytes]]] = queue.SimpleQueue()
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)

    # -- worker thread ------------------------------------------------------------------------

    def work(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None or self.stop.is_set():
                return
            link, session, req = job
            if session != link.session:
                continue  # its connection is gone (reconnected, or dropped)
            frames = self.execute(req)
            self.done.put((link, session, frames))
            try:
                self.wake_w.send(b"\0")
            except BlockingIOError:
                pass  # a wake-up byte is already pending
            except OSError:
                return  # the main thread has shut down

    def execute(self, req: PredictRequest) -> list[bytes]:
        traces = self.traces
        if traces is None:
            return self.evaluate(req)
        return traces.run(req, self.evaluate)

    def evaluate(self, req: PredictRequest) -> list[bytes]:
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
        self.ctx = zmq.Context()
        now = time.monotonic()
        self.heard_at = now
        for address in self.addresses:
            self.add_link(address, now)
        # A signal wakes the poll at once (the byte lands on the wake-up socket), so a drain
        # starts while the batches it must answer are still held, not up to a poll later.
        waking = threading.current_thread() is threading.main_thread()
        previous = signal.set_wakeup_fd(self.wake_w.fileno()) if waking else -1
        try:
            self.loop()
        finally:
            if waking:
                signal.set_wakeup_fd(previous)
            self.readiness.set(False)
            for link in self.links.values():
                link.close()
            self.stop.set()
            self.jobs.put(None)
            self.wake_r.close()
            self.wake_w.close()  # a worker still inside predict() finds it closed and exits
            self.ctx.destroy(linger=0)

    def add_link(self, address: str, now: float) -> None:
        link = FrontendLink(
            address, keys=self.keys, heartbeat_interval=self.heartbeat_interval, log=self.log
        )
        assert self.ctx is not None
        link.open(self.ctx, now)
        self.links[address] = link
        self.poller = None  # rebuilt with the new sockets

    def drop_link(self, link: FrontendLink) -> None:
        link.close()
        self.links.pop(link.address, None)
        self.poller = None
        self.update_readiness()

    def queued(self) -> int:
        """Batches received on every link and not answered yet (the queue report)."""
        return sum(link.pending for link in self.links.values())

    def update_readiness(self) -> None:
        # Ready while registered with at least one frontend (and not leaving).
        self.readiness.set(
            not self.leaving
            and any(link.registered and not link.retiring_by for link in self.links.values())
        )

    def build_poller(self) -> zmq.Poller:
        poller = zmq.Poller()
        poller.register(self.wake_r.fileno(), zmq.POLLIN)  # zmq.Poller reports it by fd
        for link in self.links.values():
            assert link.sock is not None and link.watch is not None
            poller.register(link.sock, zmq.POLLIN)
            poller.register(link.watch.monitor, zmq.POLLIN)
        return poller

    def start_leaving(self, now: float) -> None:
        self.leaving = True
        self.leave_by = now + self.drain_timeout
        self.update_readiness()
        for link in self.links.values():
            if link.connected and self.fast:
                link.acked = False
                link.send(encode_goodbye())
                self.log.info("leaving: told %s; draining %d batches", link.address, link.pending)
            else:
                link.acked = True  # nothing to tell: not connected, or the original frontend

    def loop(self) -> None:
        wake_fd = self.wake_r.fileno()
        while not self.stop.is_set():
            if not self.shared and self.parent_gone():
                self.log.warning("parent process %s is gone; exiting", self.parent_pid)
                return
            now = time.monotonic()
            if self.leave.is_set() and not self.leaving:
                self.start_leaving(now)
            if self.leaving:
                if all(link.acked for link in self.links.values()) and self.queued() == 0:
                    self.log.info("drained; exiting")
                    break
                if now >= self.leave_by:
                    self.log.warning(
                        "drain timeout (%.1f s): exiting with %d batches unanswered",
                        self.drain_timeout, self.queued(),
                    )  # fmt: skip
                    break
            elif self.shared and now - self.heard_at >= self.orphan_timeout:
                self.log.warning(
                    "no frontend heard from on any link for %.1f s (--orphan-timeout-s); "
                    "exiting", now - self.heard_at,
                )  # fmt: skip
                break
            if self.poller is None:
                self.poller = self.build_poller()
            wait = _MAX_POLL_S
            for link in self.links.values():
                wait = min(wait, link.last_rx + self.activity_timeout - now)
                if link.connected:
                    wait = min(wait, link.next_hb - now)
            events = dict(self.poller.poll(max(0, int(wait * 1000))))
            for link in list(self.links.values()):
                if link.closed:
                    continue  # dropped by a message read on another link just now
                assert link.watch is not None
                if link.watch.monitor in events:
                    link.watch.drain()
                if link.sock in events:
                    self.receive(link)
            if wake_fd in events:
                self.flush()
            self.tick(time.monotonic())
        self.repeats.flush()
        self.log.info("stopping")

    def receive(self, link: FrontendLink) -> None:
        # Bounded, so a flood of requests cannot starve heartbeats, responses or other links.
        for _ in range(256):
            sock = link.sock
            if sock is None or link.closed:
                return
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            now = time.monotonic()
            link.heard(now)
            self.heard_at = now
            self.handle(link, [p.buffer for p in parts])

    def tick(self, now: float) -> None:
        """Each link's heartbeat (with the queue report) and its silence check."""
        for link in list(self.links.values()):
            if link.retiring_by and ((link.acked and link.pending == 0) or now >= link.retiring_by):
                self.log.info(
                    "link to %s closed (%d batches unanswered)", link.address, link.pending
                )
                self.drop_link(link)
                continue
            if link.connected and now >= link.next_hb:
                link.send(encode_heartbeat())
                if self.shared and link.ours:
                    link.send(encode_queue_report(self.queued(), link.pending))
                link.next_hb = now + self.heartbeat_interval
            if now - link.last_rx < self.activity_timeout:
                continue
            self.log.warning(
                "no message from the frontend at %s for %.1fs; reconnecting%s",
                link.address,
                now - link.last_rx,
                ""
                if link.connected
                else (
                    " (never answered: are --rpc-keys those of this frontend?)"
                    if self.keys is not None
                    else " (never answered: a frontend with RPC authentication on needs --rpc-keys)"
                ),
            )
            if link.retiring_by:
                self.drop_link(link)  # being left anyway
                continue
            listed = self.dial.listed_as(link.address) if not link.connected else None
            if listed is not None and not self.leaving:
                # A socket file that takes no connection (a frontend's, seen from another
                # mount of the same path): that frontend is dialled over TCP from now on (its
                # TCP link may still be there, kept until this one was up).
                self.log.warning(
                    "the Unix socket %s never answered: dialling %s", link.address, listed
                )
                self.dial.refuse(link.address)
                self.drop_link(link)
                if listed not in self.links:
                    self.add_link(listed, now)
                continue
            assert self.ctx is not None
            link.reconnect(self.ctx, now)
            self.poller = None
            self.update_readiness()
            if self.leaving:
                link.acked = True  # that frontend is gone: nobody waits for our answers

    def handle(self, link: FrontendLink, frames: list[Frame]) -> None:
        try:
            msg = decode_frontend_message(frames)
        except WireError as e:
            self.log.warning("dropping a malformed message from %s: %s", link.address, e)
            return
        if isinstance(msg, HeartbeatReply):
            if msg.type == HeartbeatType.GOODBYE_ACK:
                link.acked = True
                link.ours = True
            elif self.leaving or link.retiring_by:
                pass  # removed as it drained: it must not register again
            elif msg.type == HeartbeatType.KEEP_ALIVE:
                link.registered = True  # known to the frontend: registered
                self.update_readiness()
            elif msg.type == HeartbeatType.REQUEST_CONTAINER_METADATA:
                link.registered = False
                self.update_readiness()
                link.send(
                    encode_new_container(
                        self.name,
                        self.version,
                        self.input_type.code,
                        fast=self.fast,
                        token=self.token,
                        features=(LOCAL_SOCKETS_FEATURE,) if self.shared else (),
                    )
                )
                self.log.info("sent metadata to %s (fast=%s)", link.address, self.fast)
            return
        if isinstance(msg, LocalSockets):
            link.ours = True
            if self.shared:
                self.dial.update(msg.pairs)  # the FRONTENDS list that follows uses them
            return
        if isinstance(msg, Frontends):
            link.ours = True
            self.set_frontends(link, msg.addresses)
            return
        if isinstance(msg, Retire):
            link.ours = True
            if not self.leave.is_set():
                self.log.info("told to retire by %s: draining, then exiting", link.address)
                self.leave.set()
            return
        if not isinstance(msg, PredictRequest):
            return  # an artifact chunk: for a fetch, never for the serving connection
        if msg.fast_meta is not None:
            link.ours = True
        link.pending += 1
        self.jobs.put((link, link.session, msg))

    def set_frontends(self, origin: FrontendLink, addresses: Sequence[str]) -> None:
        """Dial every frontend listed that has no link yet; drop the links to frontends not
        listed, but never the last live one (the list may come from a frontend that lost its
        own lease, and a replica with no frontend serves nobody)."""
        if not self.shared:
            self.log.debug("not --shared: ignoring the frontends %s sent", origin.address)
            return
        if self.leaving:
            return
        # A frontend on this machine is dialled on its Unix socket: a link on its TCP address
        # (from --frontend) is then left, like an unlisted one, once the socket's link is
        # registered there (a list later), so that frontend never has this replica on neither.
        dials = dict(zip(addresses, (self.dial.dial(a) for a in addresses), strict=True))
        wanted = set(dials.values())
        now = time.monotonic()
        for address, dial in dials.items():
            if dial not in self.links and len(self.links) < _MAX_LINKS:
                via = f" on its Unix socket {dial}" if dial != address else ""
                self.log.info("frontend %s listed by %s: linking%s", address, origin.address, via)
                self.add_link(dial, now)
        for link in list(self.links.values()):
            if link.address in wanted or link.retiring_by:
                continue
            listed = link.address if link.address in dials else self.dial.listed_as(link.address)
            replacement = self.links.get(dials[listed]) if listed in dials else None
            if replacement is not None and not replacement.registered:
                continue  # the same frontend, dialled another way: not before that link is up
            others = [x for x in self.links.values() if x is not link and x.live]
            if not others:
                continue
            what = "dialled another way now" if replacement is not None else "no longer listed"
            if link.connected and self.fast:
                # Told first, so it sends no new batch; dropped once those it sent are
                # answered (or the drain timeout passes: a dead frontend never acknowledges).
                self.log.info("frontend %s %s: leaving its link", link.address, what)
                link.acked = False
                link.retiring_by = now + self.drain_timeout
                link.send(encode_goodbye())
                self.update_readiness()
            else:
                self.log.info("frontend %s %s: dropping its link", link.address, what)
                self.drop_link(link)

    def flush(self) -> None:
        try:
            while self.wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                link, session, frames = self.done.get_nowait()
            except queue.Empty:
                return
            if session == link.session and not link.closed:
                link.pending -= 1
                link.send(frames)

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
    address: str | None,
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
    frontends: Sequence[str] = (),
    shared: bool = False,
    orphan_timeout: float = 60.0,
    traces: PredictTraces | None = None,
) -> None:
    """Serve ``model`` to the frontend at ``address`` and to each of ``frontends`` until
    ``stop_event`` is set (or the parent process is gone), or drain and return once
    ``leave_event`` is set (or a frontend sends RETIRE). Runs ``model.setup()`` first when it
    exists. ``keys``: this deployment's CURVE keys (:func:`clipper.rpc.auth.load_client_keys`),
    None for a frontend without RPC authentication. ``readiness`` is set while the container
    is registered with at least one frontend. ``shared``: follow the frontends' FRONTENDS
    lists, report the queue, ignore ``parent_pid`` and return once no frontend was heard from
    for ``orphan_timeout`` seconds. ``traces``: a span per traced batch (clipper.tracing)."""
    addresses = ([address] if address is not None else []) + list(frontends)
    if not addresses:
        raise ValueError("serve() needs a frontend address")
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
        addresses=addresses,
        heartbeat_interval=heartbeat_interval,
        activity_timeout=activity_timeout,
        fast=fast,
        parent_pid=None if shared else parent_pid,
        stop_event=stop_event or threading.Event(),
        log=log,
        token=token,
        keys=keys,
        leave_event=leave_event,
        drain_timeout=drain_timeout,
        readiness=readiness,
        shared=shared,
        orphan_timeout=orphan_timeout,
        traces=traces,
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


def start_process(rpc_keys: str | None) -> tuple[bool, ClientKeys | None]:
    """A container process's start: its log on stderr, and the CURVE keys of ``--rpc-keys``
    (None: none given); False when they cannot be read (said on stderr: the process exits 2)."""
    try:
        keys = load_client_keys(Path(rpc_keys)) if rpc_keys else None
    except ConfigError as e:
        print(f"error: --rpc-keys: {e}", file=sys.stderr)
        return False, None
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    return True, keys


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.model_path is None) == (not args.fetch_artifact):
        parser.error("give exactly one of --model-path and --fetch-artifact")
    for frontend in frontends_from(args.frontend):
        host, _, port = frontend.removeprefix("tcp://").rpartition(":")
        if not frontend.startswith("tcp://") or not host or not port.isdigit():
            parser.error(f"--frontend {frontend!r}: expected tcp://HOST:PORT")
    if args.orphan_timeout_s <= 0:
        parser.error("--orphan-timeout-s must be positive")
    if args.nice > 0:
        os.nice(args.nice)
    try:
        input_type = InputType.parse(args.input_type)
    except ValueError as e:
        print(f"error: --input-type: {e}", file=sys.stderr)
        return 2
    ok, keys = start_process(args.rpc_keys)
    if not ok:
        return 2
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
    frontends = frontends_from(args.frontend)
    # --ip/--port is dialled when given, or when it is the only frontend (the classic case).
    address: str | None = None
    if args.ipc:
        address = f"ipc://{args.ipc}"
    elif args.port is not None or not frontends:
        address = f"tcp://{args.ip}:{args.port if args.port is not None else 7000}"
    readiness: Readiness | None = None
    traces: PredictTraces | None = None
    try:
        traces = predict_traces(args.name, args.version, input_type)
        readiness = Readiness(
            Path(args.ready_file) if args.ready_file else None, args.ready_port, args.ready_host
        )
        model_path = args.model_path
        if args.fetch_artifact:
            prefixed = _Prefixed(
                _log, {"prefix": f"[{args.name}:{args.version} pid={os.getpid()}]"}
            )
            model_path = fetch_artifact(
                address=address if address is not None else frontends[0],
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
            frontends=frontends,
            shared=args.shared,
            orphan_timeout=args.orphan_timeout_s,
            traces=traces,
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
        if traces is not None:
            traces.stop()  # exports the spans still buffered
    return 0
