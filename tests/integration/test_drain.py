"""SIGTERM is a drain, with real processes: a ``clipper start`` frontend, a slow model in its own
container process, and 16 predicts in flight when the signal comes.

Contract (docs/runtime.md, "Stopping: the drain"):

* every request already read gets a complete answer (200 with the model's prediction), none a
  reset connection;
* during the drain, readiness answers 503 "draining" (asked on a keep-alive connection opened
  before the signal, whose answer says ``Connection: close``), a new connection to the query
  port is refused, and the admin port still answers;
* the frontend exits 0 within its drain timeout (plus the replicas' stop), leaving no replica;
* with a drain timeout shorter than the work, the frontend still exits, bounded, and every
  request it had read still gets a complete answer: the model's, or 503 saying the drain ended.
"""

from __future__ import annotations

import asyncio
import importlib.util
import signal
from pathlib import Path
from typing import Any

import cloudpickle
import orjson
import pytest

from clipper.choices import GRPC_TRANSPORTS
from clipper.server import Clipper
from tests.integration import models
from tests.integration.frontend_process import FrontendProcess, container_pids
from tests.integration.helpers import Response, predict, request, wait_for

pytestmark = pytest.mark.integration

APP = "slow"
MODEL = "slow"
IN_FLIGHT = 16
# slow_sums sleeps 0.3 s per batch: 16 queries in batches of BATCH take 16 / BATCH batches.
BATCH = 2


class DrainingFrontend(FrontendProcess):
    """A ``clipper start`` with its drain timeout set."""

    def __init__(self, state_dir: Path, drain_timeout_s: float, drain_delay_s: float = 0.0) -> None:
        super().__init__(state_dir)
        self.drain_timeout_s = drain_timeout_s
        self.drain_delay_s = drain_delay_s

    def command(self) -> list[str]:
        return [
            *super().command(),
            "--drain-timeout-s", str(self.drain_timeout_s),
            "--drain-delay-s", str(self.drain_delay_s),
        ]  # fmt: skip

    @property
    def query_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.query}"


def _artifact(directory: Path) -> str:
    path = directory / "slow.pkl"
    cloudpickle.register_pickle_by_value(models)
    try:
        path.write_bytes(cloudpickle.dumps(models.slow_sums))
    finally:
        cloudpickle.unregister_pickle_by_value(models)
    return str(path)


async def _serve_slow_model(fe: DrainingFrontend, tmp_path: Path, batch: int) -> None:
    await fe.admin_ok(
        "add_app",
        {"name": APP, "input_type": "doubles", "default_output": "-1",
         "latency_slo_micros": 60_000_000},
    )  # fmt: skip
    await fe.admin_ok(
        "deploy_model",
        {"model_name": MODEL, "model_version": "1", "input_type": "doubles",
         "artifact_path": _artifact(tmp_path), "num_replicas": 1,
         "batching": {"controller": "fixed", "max_batch_size": batch}},
        limit_s=60,
    )  # fmt: skip
    await fe.admin_ok("add_model_links", {"app_name": APP, "model_names": [MODEL]})
    resp = await predict(fe.query_url, APP, {"input": [0.5, 0.5]}, limit_s=30)
    assert resp.status == 200 and resp.json()["default"] is False, resp.body


async def _metric(fe: DrainingFrontend, name: str) -> float:
    resp = await request(f"{fe.query_url}/metrics", headers={"Accept": "text/plain"})
    prefix = f'{name}{{model="{MODEL}",version="1"}} '
    for line in resp.body.decode().splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return 0.0


async def _all_read(fe: DrainingFrontend, before: float) -> bool:
    """Every in-flight query is in the model's queue or was sent to its replica."""
    queued = await _metric(fe, "clipper_model_queue_depth")
    sent = await _metric(fe, "clipper_model_batch_size_sum") - before
    return queued + sent >= IN_FLIGHT


async def _refused(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except (ConnectionRefusedError, ConnectionResetError):
        # A reset: the connect reached the backlog of a listener that closed meanwhile.
        return True
    writer.close()
    return False


async def _read_answer(reader: asyncio.StreamReader) -> Response:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = {}
    for line in head[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers["content-length"]))
    return Response(int(head[0].split()[1]), headers, body)


async def _send_in_flight(fe: DrainingFrontend) -> list[asyncio.Task[Response]]:
    """IN_FLIGHT predicts (distinct inputs: no cache hit), returned once the frontend read them
    all (in the queue or in a batch)."""
    before = await _metric(fe, "clipper_model_batch_size_sum")
    tasks = [
        asyncio.create_task(predict(fe.query_url, APP, {"input": [float(i), 1.0]}, limit_s=60))
        for i in range(IN_FLIGHT)
    ]
    await wait_for(lambda: _all_read(fe, before), limit_s=30, interval=0.01, what="all read")
    return tasks


async def _exit_code(fe: DrainingFrontend, limit_s: float) -> int:
    proc = fe.proc
    assert proc is not None
    await wait_for(lambda: proc.poll() is not None, limit_s=limit_s, interval=0.05,
                   what="the frontend to exit")  # fmt: skip
    return proc.returncode


@pytest.fixture
def frontends() -> Any:
    started: list[DrainingFrontend] = []
    yield started
    for fe in started:
        fe.cleanup()


async def test_sigterm_answers_every_request_in_flight_then_exits(
    tmp_path: Path, frontends: list[DrainingFrontend]
) -> None:
    fe = DrainingFrontend(tmp_path / "state", drain_timeout_s=30.0)
    frontends.append(fe)
    await fe.start()
    await _serve_slow_model(fe, tmp_path, BATCH)
    # A keep-alive connection opened before the signal, as a load balancer's health checks
    # and pooled connections are.
    reader, writer = await asyncio.open_connection("127.0.0.1", fe.ports.query)
    writer.write(b"GET /ready HTTP/1.1\r\nHost: q\r\n\r\n")
    before = await asyncio.wait_for(_read_answer(reader), 10)
    assert before.status == 200 and "connection" not in before.headers
    in_flight = await _send_in_flight(fe)
    replicas = container_pids(fe.pid)
    assert replicas, "the model runs in its own process"

    fe.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    await wait_for(lambda: _refused(fe.ports.query), limit_s=10, interval=0.01,
                   what="new connections to the query port to be refused")  # fmt: skip
    # During the drain: the admin port answers; readiness is withdrawn, on the connection
    # that was open, and that connection is told to close.
    ping = await request(f"{fe.admin_url}/admin/ping", limit_s=5)
    assert ping.status == 200
    writer.write(b"GET /ready HTTP/1.1\r\nHost: q\r\n\r\n")
    ready = await asyncio.wait_for(_read_answer(reader), 10)
    assert not all(t.done() for t in in_flight), "the drain was over before it was looked at"
    assert ready.status == 503, ready.body
    assert ready.headers.get("connection") == "close"
    doc = orjson.loads(ready.body)
    assert doc["ready"] is False and doc["draining"] is True
    assert doc["reasons"][0].startswith("draining"), doc
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed after that answer
    writer.close()

    answers = await asyncio.gather(*in_flight)  # raises on a reset or a cut answer
    assert [a.status for a in answers] == [200] * IN_FLIGHT, [a.body[:200] for a in answers]
    for i, a in enumerate(answers):
        doc = a.json()
        assert (doc["output"], doc["default"]) == (i + 1.0, False), a.body
    # Within the drain timeout (counted from the signal: its wait started before it).
    assert await _exit_code(fe, limit_s=fe.drain_timeout_s) == 0, fe.log_tail()
    await wait_for(lambda: not container_pids(fe.pid), limit_s=10, what="the replica to exit")
    assert "draining: 16 requests in flight" in fe.log_tail(20_000)


async def test_a_drain_timeout_shorter_than_the_work_still_ends_with_clean_answers(
    tmp_path: Path, frontends: list[DrainingFrontend]
) -> None:
    fe = DrainingFrontend(tmp_path / "state", drain_timeout_s=1.0)
    frontends.append(fe)
    await fe.start()
    await _serve_slow_model(fe, tmp_path, 1)  # 16 batches of 0.3 s: far more than 1 s
    in_flight = await _send_in_flight(fe)

    fe.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    answers = await asyncio.gather(*in_flight)  # each complete: none reset, none hanging
    statuses = [a.status for a in answers]
    assert set(statuses) <= {200, 503} and 503 in statuses, statuses
    for a in answers:
        if a.status == 200:
            assert a.json()["default"] is False
        else:
            doc = a.json()
            assert doc["error"] == "Service Unavailable", doc
            assert "drain_timeout_s" in doc["cause"] and "retry" in doc["cause"], doc
    # Bounded: the drain's second, then the replica's stop (its last batch, a few seconds).
    assert await _exit_code(fe, limit_s=15.0) == 0, fe.log_tail()
    assert "the drain ended (1 s passed)" in fe.log_tail(20_000)


@pytest.mark.skipif(
    importlib.util.find_spec("tritonclient") is None,
    reason="pip install 'tritonclient[grpc]' to run the real V2 gRPC client",
)
@pytest.mark.parametrize("transport", GRPC_TRANSPORTS.names)
async def test_clipper_stop_answers_a_grpc_call_in_flight(transport: str) -> None:
    """Both gRPC transports: a ModelInfer call in flight when ``Clipper.stop()`` begins gets
    its answer; afterwards the port is closed."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, grpc_port=0, grpc_transport=transport
    ) as c:
        await c.deploy_model(MODEL, "1", models.slow_sums, input_type="doubles")
        await c.register_application(APP, "doubles", "-1.0", 30_000_000)
        await c.link_model_to_app(APP, MODEL)
        assert c.grpc is not None
        url = f"127.0.0.1:{c.grpc.port}"

        def infer() -> Any:
            client = grpcclient.InferenceServerClient(url=url)
            try:
                inp = grpcclient.InferInput("input", [2, 2], "FP64")
                inp.set_data_from_numpy(np.array([[1.0, 2.0], [3.0, 4.0]]))
                return client.infer(APP, [inp]).as_numpy("output")
            finally:
                client.close()

        call = asyncio.create_task(asyncio.to_thread(infer))
        sched = c.catalog.scheduler(MODEL)
        assert sched is not None
        await wait_for(lambda: any(r.in_flight for r in sched.replicas) or call.done(),
                       limit_s=30, what="the call's batch at the replica")  # fmt: skip
        assert not call.done()
        await c.stop()
        assert list(await call) == [3.0, 7.0]
        port = int(url.rsplit(":", 1)[1])
    assert await _refused(port)


async def test_with_a_drain_delay_new_connections_are_served_while_not_ready(
    tmp_path: Path, frontends: list[DrainingFrontend]
) -> None:
    """--drain-delay-s: after SIGTERM readiness is withdrawn at once, but a new connection (a
    balancer that has not probed yet) still gets its prediction; then the port closes."""
    fe = DrainingFrontend(tmp_path / "state", drain_timeout_s=10.0, drain_delay_s=3.0)
    frontends.append(fe)
    await fe.start()
    await _serve_slow_model(fe, tmp_path, BATCH)
    fe.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]

    async def not_ready() -> bool:
        return (await request(f"{fe.query_url}/ready", limit_s=5)).status == 503

    await wait_for(not_ready, limit_s=10, interval=0.01, what="readiness to be withdrawn")
    resp = await predict(fe.query_url, APP, {"input": [7.0, 1.0]}, limit_s=10)  # new connection
    assert resp.status == 200 and resp.json()["output"] == 8.0, resp.body
    await wait_for(lambda: _refused(fe.ports.query), limit_s=10, interval=0.01,
                   what="the query port to close after the delay")  # fmt: skip
    assert await _exit_code(fe, limit_s=20) == 0, fe.log_tail()
    assert "accepting connections for 3 s more" in fe.log_tail(20_000)
