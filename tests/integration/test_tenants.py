"""Tenants end to end, with a real ``clipper start`` frontend and a model in its own container
process: keys made through the admin API, a tenant over its quota answered 429 with
``Retry-After`` and the RateLimit header fields (REST and V2 REST; over V2 gRPC on both
transports, RESOURCE_EXHAUSTED with them as trailing metadata) while another tenant's queries
all succeed, an application that requires a key, and a critical tenant's predictions
under a sheddable tenant's flood (docs/tenants.md)."""

from __future__ import annotations

import asyncio
import os
import struct
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import cloudpickle
import orjson
import pytest

from clipper.client import Client
from clipper.errors import RequestError
from tests.integration import models
from tests.integration.frontend_process import FrontendProcess
from tests.integration.helpers import Response, request

pytestmark = pytest.mark.integration

FLOODERS = 24
SRC = str(Path(__file__).resolve().parents[2] / "src")


class TenantFrontend(FrontendProcess):
    @property
    def query_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.query}"

    async def predict(
        self, app: str, key: str | None = None, priority: str | None = None, **kw: Any
    ) -> Response:
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        if priority is not None:
            headers["X-Priority"] = priority
        body = orjson.dumps({"input": [1.0, 2.0]})
        return await request(f"{self.query_url}/{app}/predict", "POST", body, headers=headers, **kw)


def _artifact(directory: Path, fn: Any) -> str:
    path = directory / f"{fn.__name__}.pkl"
    cloudpickle.register_pickle_by_value(models)
    try:
        path.write_bytes(cloudpickle.dumps(fn))
    finally:
        cloudpickle.unregister_pickle_by_value(models)
    return str(path)


async def _serve(
    fe: TenantFrontend, tmp_path: Path, app: str, fn: Any, *, slo_micros: int, batch: int
) -> None:
    await fe.admin_ok(
        "add_app",
        {"name": app, "input_type": "doubles", "default_output": "-1",
         "latency_slo_micros": slo_micros, "cache": False},  # every query reaches the model
    )  # fmt: skip
    await fe.admin_ok(
        "deploy_model",
        {"model_name": app, "model_version": "1", "input_type": "doubles",
         "artifact_path": _artifact(tmp_path, fn), "num_replicas": 1,
         "batching": {"controller": "fixed", "max_batch_size": batch}},
        limit_s=60,
    )  # fmt: skip
    await fe.admin_ok("add_model_links", {"app_name": app, "model_names": [app]})


@pytest.fixture
async def fe(tmp_path: Path) -> AsyncIterator[TenantFrontend]:
    frontend = TenantFrontend(tmp_path / "state")
    await frontend.start()
    try:
        yield frontend
    finally:
        frontend.cleanup()


async def _key(fe: TenantFrontend, tenant: str, **doc: Any) -> str:
    made = await fe.admin_ok("create_key", {"tenant": tenant, **doc})
    assert made["tenant"] == tenant and made["key"].startswith("ck_")
    return str(made["key"])


async def test_a_tenant_over_its_quota_gets_429_while_another_tenants_queries_succeed(
    fe: TenantFrontend, tmp_path: Path
) -> None:
    await _serve(fe, tmp_path, "q", models.steady_sums, slo_micros=5_000_000, batch=8)
    # One token every 10 s: the test's requests never see a refill.
    await fe.admin_ok("add_tenant", {"name": "noisy", "quotas": {"*": {"rate": 0.1, "burst": 3}}})
    await fe.admin_ok("add_tenant", {"name": "calm"})
    noisy, calm = await _key(fe, "noisy"), await _key(fe, "calm")
    listed = await fe.admin_ok("get_tenants", {})
    assert {t["name"] for t in listed} == {"noisy", "calm"}
    assert noisy not in orjson.dumps(listed).decode()  # the key is never shown again

    statuses: dict[str, list[int]] = {"noisy": [], "calm": []}
    refusals: list[Response] = []
    for _ in range(10):
        for name, key in (("noisy", noisy), ("calm", calm)):
            resp = await fe.predict("q", key, limit_s=30)
            statuses[name].append(resp.status)
            if name == "calm":
                assert resp.status == 200 and resp.json()["default"] is False, resp.body
            elif resp.status == 429:
                refusals.append(resp)
    assert statuses["noisy"] == [200] * 3 + [429] * 7
    assert statuses["calm"] == [200] * 10
    first = refusals[0]
    assert 1 <= int(first.headers["retry-after"]) <= 10
    assert first.headers["ratelimit-policy"] == '"all";q=3;w=30'
    assert first.headers["ratelimit"].startswith('"all";r=0;t=')
    assert "tenant 'noisy' is over its quota" in first.json()["cause"]
    # V2 REST refuses the same way, before parsing the body.
    v2 = await request(
        f"{fe.query_url}/v2/models/q/infer", "POST", b"not json",
        headers={"X-Api-Key": noisy}, limit_s=10,
    )  # fmt: skip
    assert v2.status == 429 and "retry-after" in v2.headers, v2.body
    metrics = (await request(f"{fe.query_url}/metrics", limit_s=10)).body.decode()
    assert 'clipper_tenant_refused_total{reason="quota",tenant="noisy"} 8.0' in metrics
    assert 'clipper_tenant_admitted_total{class="standard",tenant="calm"} 10.0' in metrics


async def test_an_application_that_requires_a_key_refuses_without_one(
    fe: TenantFrontend, tmp_path: Path
) -> None:
    await _serve(fe, tmp_path, "k", models.steady_sums, slo_micros=5_000_000, batch=8)
    await fe.admin_ok("update_app", {"name": "k", "require_key": True})
    await fe.admin_ok("add_tenant", {"name": "t", "priority": "standard"})
    key = await _key(fe, "t")
    anonymous = await fe.predict("k", limit_s=10)
    assert anonymous.status == 401 and anonymous.headers["www-authenticate"].startswith("Bearer")
    assert "requires an API key" in anonymous.json()["cause"]
    unknown = await fe.predict("k", "ck_not-a-key", limit_s=10)
    assert unknown.status == 401
    raised = await fe.predict("k", key, priority="critical", limit_s=10)
    assert raised.status == 403 and "may only lower" in raised.json()["cause"]
    ok = await fe.predict("k", key, priority="sheddable", limit_s=30)
    assert ok.status == 200 and ok.json()["default"] is False
    key_id = (await fe.admin_ok("get_tenants", {"name": "t"}))["keys"][0]["key_id"]
    await fe.admin_ok("delete_key", {"tenant": "t", "key_id": key_id})
    assert (await fe.predict("k", key, limit_s=10)).status == 401  # revoked at once


async def test_a_critical_tenant_keeps_its_predictions_under_a_sheddable_flood(
    fe: TenantFrontend, tmp_path: Path
) -> None:
    # paced_sums: 5 ms a batch and 20 ms an input, batches of 2: about 45 inputs/s, so at most
    # about 13 queries fit in a 300 ms SLO at once; the sheddable tenant offers 3x that.
    await _serve(fe, tmp_path, "p", models.paced_sums, slo_micros=300_000, batch=2)
    await fe.admin_ok("add_tenant", {"name": "gold", "priority": "critical"})
    await fe.admin_ok("add_tenant", {"name": "bulk", "priority": "sheddable"})
    gold, bulk = await _key(fe, "gold"), await _key(fe, "bulk")
    for _ in range(20):  # measured first: admission prices from the batches it saw
        assert (await fe.predict("p", gold, limit_s=30)).status == 200

    done = asyncio.Event()
    bulk_results: list[bool] = []

    loop = asyncio.get_running_loop()

    async def flood() -> None:
        # 3x the model's 45 inputs/s, spread over the clients (an offered rate, not a spin:
        # a default answered at once does not bring its client straight back).
        period = FLOODERS / (3 * 45)
        while not done.is_set():
            started = loop.time()
            resp = await fe.predict("p", bulk, limit_s=30)
            assert resp.status == 200, resp.body
            bulk_results.append(bool(resp.json()["default"]))
            await asyncio.sleep(max(0.0, period - (loop.time() - started)))

    why: list[str] = []

    async def critical(n: int) -> list[bool]:
        got = []
        for _ in range(n):
            resp = await fe.predict("p", gold, limit_s=30)
            assert resp.status == 200, resp.body
            doc = resp.json()
            got.append(not doc["default"])
            if doc["default"]:
                why.append(doc.get("default_explanation", ""))
        return got

    flooders = [asyncio.create_task(flood()) for _ in range(FLOODERS)]
    try:
        await asyncio.sleep(0)  # the flood starts first
        answers = [a for part in await asyncio.gather(critical(50), critical(50)) for a in part]
    finally:
        done.set()
        await asyncio.gather(*flooders)
    assert sum(answers) >= 0.99 * len(answers), f"{sum(answers)} of {len(answers)}: {why}"
    assert len(bulk_results) > len(answers)  # it really was a flood ...
    assert sum(bulk_results) > 0, (len(bulk_results), len(answers))  # ... with defaults
    metrics = (await request(f"{fe.query_url}/metrics", limit_s=10)).body.decode()
    assert 'clipper_tenant_shed_total{class="sheddable",tenant="bulk"}' in metrics


async def _cli(fe: TenantFrontend, *args: str) -> tuple[int, str, str]:
    env = {
        **os.environ,
        "CLIPPER_ADMIN_URL": fe.admin_url,
        "CLIPPER_URL": fe.query_url,
        "PYTHONPATH": SRC,
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "clipper", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_cli_and_the_client_manage_tenants_and_send_keys(
    fe: TenantFrontend, tmp_path: Path
) -> None:
    await _serve(fe, tmp_path, "c", models.steady_sums, slo_micros=5_000_000, batch=8)
    code, out, err = await _cli(fe, "tenant", "add", "t", "--priority", "sheddable",
                                "--quota", "*=0.1/1", "--quota", "c=0.1/5")  # fmt: skip
    assert code == 0, err
    assert orjson.loads(out)["quotas"] == {
        "*": {"rate": 0.1, "burst": 1},
        "c": {"rate": 0.1, "burst": 5},
    }
    code, out, err = await _cli(fe, "tenant", "key", "t")
    assert code == 0, err
    key = out.splitlines()[0]
    assert key.startswith("ck_") and "shown only now" in out
    code, out, _ = await _cli(fe, "tenant", "list")
    assert code == 0 and out.startswith("t: sheddable; quotas *=0.1/1, c=0.1/5; keys ")
    assert key not in out
    code, _, err = await _cli(fe, "app", "update", "c", "--require-key", "on")
    assert code == 0, err

    def queries() -> tuple[dict[str, Any], list[RequestError]]:
        first = Client(fe.admin_url, fe.query_url, api_key=key).predict("c", [1.0, 2.0])
        errors = []
        for client in (
            Client(fe.admin_url, fe.query_url, api_key=key),
            Client(fe.admin_url, fe.query_url),
        ):
            try:
                client.predict("c", [1.0, 2.0])
            except RequestError as e:
                errors.append(e)
        return first, errors

    first, (over, anonymous) = await asyncio.to_thread(queries)
    assert first["default"] is False
    assert over.status == 429 and "over its quota across all applications" in str(over)
    assert anonymous.status == 401
    code, _, err = await _cli(fe, "tenant", "add", "t", "--quota", "nonsense")
    assert code != 0 and "SCOPE=RATE/BURST" in err
    code, _, err = await _cli(fe, "tenant", "delete", "t")
    assert code == 0, err
    assert await asyncio.to_thread(Client(fe.admin_url, fe.query_url).list_tenants) == []


@pytest.mark.parametrize("transport", ["native", "grpcio"])
async def test_over_grpc_a_tenant_over_its_quota_gets_resource_exhausted_with_retry_metadata(
    tmp_path: Path, transport: str
) -> None:
    import grpc

    from clipper.frontend.grpc import inference_pb2 as pb
    from clipper.frontend.grpc import inference_pb2_grpc as pb_grpc

    fe = TenantFrontend(tmp_path / "state", grpc_transport=transport)
    await fe.start()
    try:
        await _serve(fe, tmp_path, "g", models.steady_sums, slo_micros=5_000_000, batch=8)
        await fe.admin_ok(
            "add_tenant", {"name": "noisy", "quotas": {"g": {"rate": 0.1, "burst": 2}}}
        )
        await fe.admin_ok("add_tenant", {"name": "calm", "priority": "critical"})
        noisy, calm = await _key(fe, "noisy"), await _key(fe, "calm")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{fe.grpc_port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]

            async def infer(metadata: tuple[tuple[str, str], ...]) -> Any:
                request = pb.ModelInferRequest(model_name="g")
                request.inputs.add(name="input", datatype="FP64", shape=[1, 2])
                request.raw_input_contents.append(struct.pack("<2d", 1.0, 2.0))
                return await stub.ModelInfer(request, metadata=metadata, timeout=30)

            for _ in range(2):  # the burst
                await infer((("x-api-key", noisy),))
            refusals = []
            for _ in range(5):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await infer((("authorization", f"Bearer {noisy}"),))
                refusals.append(err.value)
                # The other tenant, between the refusals: every call answered by the model.
                ok = await infer((("x-api-key", calm), ("x-priority", "critical")))
                assert struct.unpack("<d", ok.raw_output_contents[0])[0] == 3.0
            first = refusals[0]
            assert first.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "tenant 'noisy' is over its quota" in (first.details() or "")
            trailing = dict(first.trailing_metadata() or ())
            assert 1 <= int(trailing["retry-after"]) <= 10, trailing
            assert trailing["ratelimit-policy"] == '"app.g";q=2;w=20', trailing
            assert trailing["ratelimit"].startswith('"app.g";r=0;t='), trailing
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await infer((("x-api-key", "ck_not-a-key"),))
            assert unknown.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "www-authenticate" in dict(unknown.value.trailing_metadata() or ())
        metrics = (await request(f"{fe.query_url}/metrics", limit_s=10)).body.decode()
        assert 'clipper_tenant_refused_total{reason="quota",tenant="noisy"} 5.0' in metrics
        assert 'clipper_tenant_admitted_total{class="critical",tenant="calm"} 5.0' in metrics
    finally:
        fe.cleanup()
