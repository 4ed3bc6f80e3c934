"""A real ``python -m clipper.container`` driven by a mock frontend (a pyzmq ROUTER in the test)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import orjson
import pytest
import zmq

from clipper.container.runtime import ERROR_KEY, load_model, serve
from clipper.inputs import InputType
from clipper.rpc import wire
from clipper.rpc.wire import (
    FAST_TOKEN,
    ArtifactRequest,
    Goodbye,
    Heartbeat,
    HeartbeatType,
    NewContainer,
    PredictResponse,
    QueueReport,
    decode_container_message,
)

pytestmark = pytest.mark.integration

SRC = str(Path(__file__).resolve().parents[2] / "src")
TIMEOUT_S = 10.0


class MockFrontend:
    """The frontend's side of the RPC: a ROUTER on a random port of 127.0.0.1."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{self.port}"

    def recv(self, timeout: float = TIMEOUT_S) -> tuple[bytes, list[bytes]]:
        if not self.sock.poll(int(timeout * 1000)):
            raise AssertionError(f"no message from the container within {timeout}s")
        identity, *frames = self.sock.recv_multipart()
        return identity, frames

    def recv_decoded(
        self, skip_heartbeats: bool = True, timeout: float = TIMEOUT_S
    ) -> tuple[
        bytes,
        Heartbeat | NewContainer | PredictResponse | Goodbye | ArtifactRequest | QueueReport,
        list[bytes],
    ]:
        deadline = time.monotonic() + timeout
        while True:
            identity, frames = self.recv(max(0.0, deadline - time.monotonic()))
            msg = decode_container_message(frames)
            if not (skip_heartbeats and isinstance(msg, Heartbeat)):
                return identity, msg, frames

    def send(self, identity: bytes, frames: list[bytes]) -> None:
        self.sock.send_multipart([identity, *frames])

    def register(self) -> tuple[bytes, NewContainer, list[bytes]]:
        """Heartbeat -> metadata request -> metadata, as the real frontend does."""
        identity, first = self.recv()
        assert decode_container_message(first) == Heartbeat()
        self.send(identity, wire.encode_heartbeat_reply(HeartbeatType.REQUEST_CONTAINER_METADATA))
        ident2, meta, frames = self.recv_decoded()
        assert ident2 == identity
        assert isinstance(meta, NewContainer)
        return identity, meta, frames

    def predict(self, identity: bytes, frames: list[bytes]) -> PredictResponse:
        self.send(identity, frames)
        _, msg, _ = self.recv_decoded()
        assert isinstance(msg, PredictResponse)
        return msg

    def close(self) -> None:
        self.ctx.destroy(linger=0)


@pytest.fixture
def frontend() -> Iterator[MockFrontend]:
    fe = MockFrontend()
    try:
        yield fe
    finally:
        fe.close()


def _pickle(tmp_path: Path, model: object, name: str = "model.pkl") -> Path:
    path = tmp_path / name
    path.write_bytes(cloudpickle.dumps(model))
    return path


@pytest.fixture
def start_container(
    tmp_path: Path, frontend: MockFrontend
) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(model: object, *args: str, input_type: str = "doubles") -> subprocess.Popen[bytes]:
        path = _pickle(tmp_path, model, f"model{len(procs)}.pkl")
        env = {**os.environ, "PYTHONPATH": SRC, "CLIPPER_MODEL_VERSION": "v1"}
        cmd = [
            sys.executable,
            "-m",
            "clipper.container",
            "--model-path",
            str(path),
            "--name",
            "m",
            "--input-type",
            input_type,
            "--port",
            str(frontend.port),
            *args,
        ]
        proc = subprocess.Popen(cmd, env=env)
        procs.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(TIMEOUT_S)


def _sum_model(xs: Any) -> list[float]:
    return [float(np.asarray(x).sum()) for x in xs]


def _doubles(*rows: list[float]) -> list[bytes]:
    return [np.asarray(r, dtype="<f8").tobytes() for r in rows]


def test_register_fast_and_v3_predict(
    frontend: MockFrontend, start_container: Callable[..., subprocess.Popen[bytes]]
) -> None:
    start_container(lambda xs: [float(x.sum()) for x in xs])
    identity, meta, raw = frontend.register()
    assert meta == NewContainer("m", "v1", 3, 3, fast=True)
    assert raw == [b"", b"\x00" * 4, b"m", b"v1", b"3", b"\x03\x00\x00\x00", FAST_TOKEN]

    fast = wire.encode_predict_fast(41, InputType.DOUBLES, _doubles([1, 2, 3], [4, 5, 6]))
    assert frontend.predict(identity, fast) == PredictResponse(41, [6.0, 15.0], None, False)

    ragged = wire.encode_predict_fast(42, InputType.DOUBLES, _doubles([1, 2, 3], [10]))
    assert frontend.predict(identity, ragged) == PredictResponse(42, [6.0, 10.0], None, False)

    v3 = wire.encode_predict_v3(43, InputType.DOUBLES, _doubles([1, 1], [2, 2], [0.5, 0.25]))
    assert frontend.predict(identity, v3) == PredictResponse(43, ["2.0", "4.0", "0.75"], None, True)


def test_model_errors_fail_the_batch_only(
    frontend: MockFrontend, start_container: Callable[..., subprocess.Popen[bytes]]
) -> None:
    def model(xs: Any) -> Any:
        first = float(xs[0][0])
        if first < 0:
            raise ValueError("negative input")
        if first == 99:
            return [1.0]  # too few outputs
        if first == 98:
            return 5.0  # not a sequence
        return [float(x.sum()) for x in xs]

    start_container(model)
    identity, _, _ = frontend.register()

    def fast(mid: int, *rows: list[float]) -> PredictResponse:
        return frontend.predict(
            identity, wire.encode_predict_fast(mid, InputType.DOUBLES, _doubles(*rows))
        )

    assert fast(1, [-1.0], [2.0]) == PredictResponse(1, None, "ValueError: negative input", False)
    assert fast(2, [1.0], [2.0]) == PredictResponse(2, [1.0, 2.0], None, False)
    assert fast(3, [99.0], [2.0]) == PredictResponse(
        3, None, "predict returned 1 outputs for 2 inputs", False
    )
    bad_type = fast(4, [98.0])
    assert bad_type.error is not None
    assert "predict returned float" in bad_type.error
    # v3 has no error channel: every output carries the error as JSON.
    v3 = frontend.predict(identity, wire.encode_predict_v3(5, 3, _doubles([-1.0], [2.0])))
    assert v3.msg_id == 5
    assert v3.outputs is not None
    assert [orjson.loads(str(o)) for o in v3.outputs] == [
        {ERROR_KEY: "ValueError: negative input"}
    ] * 2
    assert fast(6, [3.0]) == PredictResponse(6, [3.0], None, False)
    # An input of the wrong type fails its batch, not the container.
    ints = wire.encode_predict_fast(7, InputType.INTS, [b"\x01\x00\x00\x00"])
    resp = frontend.predict(identity, ints)
    assert resp.error is not None
    assert "input type mismatch" in resp.error


def test_strings_input(
    frontend: MockFrontend, start_container: Callable[..., subprocess.Popen[bytes]]
) -> None:
    start_container(
        lambda xs: [f"{type(s).__name__}:{s.upper()}" for s in xs], input_type="strings"
    )
    identity, meta, _ = frontend.register()
    assert meta.input_code == 4
    items = ["héllo".encode(), b"ab"]
    resp = frontend.predict(identity, wire.encode_predict_fast(1, InputType.STRINGS, items))
    assert resp.outputs == ["str:HÉLLO", "str:AB"]
    resp = frontend.predict(identity, wire.encode_predict_v3(2, InputType.STRINGS, items))
    assert resp == PredictResponse(2, ["str:HÉLLO", "str:AB"], None, True)


def test_json_input(
    frontend: MockFrontend, start_container: Callable[..., subprocess.Popen[bytes]]
) -> None:
    class Model:
        def __init__(self) -> None:
            self.ready = False

        def setup(self) -> None:
            self.ready = True

        def predict(self, xs: list[Any]) -> list[Any]:
            return [{"ready": self.ready, "got": x} for x in xs]

    start_container(Model(), input_type="json")
    identity, meta, _ = frontend.register()
    assert meta.input_code == 4
    items = [orjson.dumps({"a": [1, 2]}), b"3", b'"s"']
    resp = frontend.predict(identity, wire.encode_predict_fast(1, InputType.JSON, items))
    assert resp.outputs == [
        {"ready": True, "got": {"a": [1, 2]}},
        {"ready": True, "got": 3},
        {"ready": True, "got": "s"},
    ]
    # v3 carries json as strings (code 4); non-str outputs come back JSON-encoded.
    resp = frontend.predict(identity, wire.encode_predict_v3(2, InputType.JSON, items[:1]))
    assert resp.raw_strings
    assert resp.outputs is not None
    assert orjson.loads(str(resp.outputs[0])) == {"ready": True, "got": {"a": [1, 2]}}


def test_v3_only_does_not_advertise_fast(
    frontend: MockFrontend, start_container: Callable[..., subprocess.Popen[bytes]]
) -> None:
    start_container(lambda xs: ["s"] * len(xs), "--v3-only")
    _, meta, raw = frontend.register()
    assert meta.fast is False
    assert len(raw) == 6


def test_heartbeats_flow_during_slow_predict(
    frontend: MockFrontend, start_container: Callable[..., subprocess.Popen[bytes]]
) -> None:
    def slow(xs: Any) -> list[int]:
        time.sleep(1.0)  # the model is slow; the test itself only polls
        return [1] * len(xs)

    start_container(slow, "--heartbeat-interval", "0.1")
    identity, _, _ = frontend.register()
    frontend.send(identity, wire.encode_predict_fast(1, InputType.DOUBLES, _doubles([1.0])))
    heartbeats = 0
    while True:
        _, msg, _ = frontend.recv_decoded(skip_heartbeats=False)
        if isinstance(msg, Heartbeat):
            heartbeats += 1
            continue
        assert msg == PredictResponse(1, [1], None, False)
        break
    assert heartbeats >= 3


def test_reconnects_with_new_identity_after_silence(
    frontend: MockFrontend, start_container: Callable[..., subprocess.Popen[bytes]]
) -> None:
    start_container(_sum_model, "--activity-timeout", "0.3")
    first, frames = frontend.recv()
    assert decode_container_message(frames) == Heartbeat()
    # The frontend never answers, so the container must drop the socket and come back.
    second, frames = frontend.recv()
    assert decode_container_message(frames) == Heartbeat()
    assert second != first


def test_sigterm_exits_zero(
    frontend: MockFrontend, start_container: Callable[..., subprocess.Popen[bytes]]
) -> None:
    proc = start_container(_sum_model)
    frontend.register()  # fully up: signal handlers installed, serving
    proc.send_signal(signal.SIGTERM)
    identity, msg, _ = frontend.recv_decoded()
    assert isinstance(msg, Goodbye)  # it tells the frontend it leaves (its drain: see below)
    frontend.send(identity, wire.encode_heartbeat_reply(HeartbeatType.GOODBYE_ACK))
    assert proc.wait(TIMEOUT_S) == 0


def test_exits_when_parent_is_gone(
    frontend: MockFrontend, start_container: Callable[..., subprocess.Popen[bytes]]
) -> None:
    # The with block closes the parent's stdin pipe (unclosed, it is a ResourceWarning).
    with subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    ) as parent:
        try:
            proc = start_container(_sum_model, "--parent-pid", str(parent.pid))
            frontend.register()
            assert proc.poll() is None
        finally:
            parent.kill()
            parent.wait(TIMEOUT_S)  # reaped, so kill(pid, 0) fails in the container
    assert proc.wait(TIMEOUT_S) == 0


def test_bad_input_type_flag_exits_2(tmp_path: Path) -> None:
    path = _pickle(tmp_path, _sum_model)
    env = {**os.environ, "PYTHONPATH": SRC}
    cmd = [sys.executable, "-m", "clipper.container", "--model-path", str(path), "--name", "m"]
    proc = subprocess.run(
        [*cmd, "--input-type", "quaternions"],
        check=False,
        env=env,
        capture_output=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 2
    assert b"unknown input type" in proc.stderr


def test_closure_directory_and_serve_in_a_thread(frontend: MockFrontend, tmp_path: Path) -> None:
    class Model:
        setup_calls = 0

        def setup(self) -> None:
            self.setup_calls += 1

        def predict(self, xs: Any) -> Any:
            assert isinstance(xs, np.ndarray)
            assert xs.shape == (2, 2)
            assert not xs.flags.writeable
            return xs.sum(axis=1)  # an ndarray is a valid output sequence

    (tmp_path / "closure").mkdir()
    _pickle(tmp_path / "closure", Model(), "func.pkl")
    model: Any = load_model(tmp_path / "closure")
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            serve(
                model,
                name="t",
                version="2",
                input_type=InputType.DOUBLES,
                address=frontend.address,
                stop_event=stop,
            )
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        identity, meta, _ = frontend.register()
        assert meta == NewContainer("t", "2", 3, 3, fast=True)
        assert model.setup_calls == 1
        items = _doubles([1, 2], [3, 4])
        resp = frontend.predict(identity, wire.encode_predict_fast(1, InputType.DOUBLES, items))
        assert resp == PredictResponse(1, [3.0, 7.0], None, False)
        resp = frontend.predict(identity, wire.encode_predict_v3(2, InputType.DOUBLES, items))
        assert resp == PredictResponse(2, ["3.0", "7.0"], None, True)
    finally:
        stop.set()
        thread.join(TIMEOUT_S)
    assert not thread.is_alive()
    assert errors == []
