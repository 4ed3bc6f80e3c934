"""The ``k8s://`` container manager against a Kubernetes API emulator (kmock), with the
Deployments it creates run by a local kubelet (tests/integration/kubelet.py): a query is
answered end to end by pods started from manifests the manager rendered.

The same contract as every manager (the conformance checks):

* ensure 2 -> a Deployment with 2 replicas, 2 replicas connected and answering; the replica
  key Secret created; the artifact fetched from the frontend, never read from its disk; the
  Deployment's pod passes Pod Security "restricted" and (where kubernetes-validate is
  installed) strict schema validation, and has a PodDisruptionBudget of its own;
* scale to 1 under a steady closed loop -> 0 failed queries; the pod that went is the one the
  manager drained and marked with the lowest pod-deletion-cost;
* a replica process SIGKILLed -> restarted, and the restart reported by ``get_replicas``;
* a frontend that stops deletes its Deployments and their budgets.

Runs with ``-m k8s`` in ``.ci/run``'s Kubernetes environment (the ``[kubernetes]`` extra and
kmock); skipped elsewhere.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.frontend_process import FrontendProcess
from tests.integration.helpers import predict, wait_for, write_row_sums
from tests.integration.kubelet import LocalKubelet
from tests.unit.test_k8s_manifests import HAS_VALIDATE, restricted_violations, validate

HAVE = all(importlib.util.find_spec(m) is not None for m in ("kubernetes", "kmock"))

pytestmark = [
    pytest.mark.integration,
    pytest.mark.k8s,
    pytest.mark.skipif(
        not HAVE, reason="needs the [kubernetes] extra and kmock (-m k8s in .ci/run)"
    ),
]

NS = "clipper-test"
APP = "k8s-app"
MODEL = "sums"


class K8sFrontend(FrontendProcess):
    def __init__(self, state_dir: Path, api: str) -> None:
        super().__init__(state_dir, name="k8s-frontend")
        self.api = api

    def command(self) -> list[str]:
        manager = f"k8s://{NS}?api={self.api}&image=clipper-serve:test&drain_timeout=5"
        return [*super().command(), "--manager", manager, "--node-id", "fe-0"]


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[Any, K8sFrontend, LocalKubelet]]:
    import kmock

    async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator):
        api = str(emulator.url).rstrip("/")
        fe = K8sFrontend(tmp_path / "state", api)
        kubelet = LocalKubelet(api, NS, tmp_path / "kubelet")
        try:
            await fe.start()
            kubelet.start()
            yield emulator, fe, kubelet
        finally:
            # In a thread: the emulator answers on this loop, and a stopping frontend calls it.
            await asyncio.to_thread(fe.stop)
            await kubelet.stop()
            await asyncio.to_thread(fe.cleanup)


async def replicas(fe: FrontendProcess) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = await fe.admin_ok("get_replicas", {"model_name": MODEL})
    return found


async def deployments(kubelet: LocalKubelet) -> list[dict[str, Any]]:
    listing = await kubelet._get(f"/apis/apps/v1/namespaces/{NS}/deployments")
    items: list[dict[str, Any]] = (listing or {}).get("items", [])
    return items


async def budgets(kubelet: LocalKubelet) -> list[dict[str, Any]]:
    listing = await kubelet._get(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets")
    items: list[dict[str, Any]] = (listing or {}).get("items", [])
    return items


def as_applied(obj: dict[str, Any]) -> dict[str, Any]:
    """An object as the manager sent it: without what the API server adds."""
    meta = {k: obj["metadata"][k] for k in ("name", "namespace", "labels", "annotations")}
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": meta} | {
        "spec": obj["spec"]
    }


async def answered(url: str, x: float) -> bool:
    resp = await predict(url, APP, {"input": [x, 2.0]}, limit_s=10.0)
    doc = resp.json() if resp.status == 200 else {}
    return doc.get("default") is False and doc.get("output") == x + 2.0


async def test_replicas_run_as_deployments_through_the_api(
    cluster: tuple[Any, K8sFrontend, LocalKubelet], tmp_path: Path
) -> None:
    _, fe, kubelet = cluster
    url = f"http://127.0.0.1:{fe.ports.query}"
    artifact = write_row_sums(tmp_path)
    await fe.admin_ok(
        "add_app",
        {
            "name": APP,
            "input_type": "doubles",
            "default_output": "-1",
            "latency_slo_micros": 5_000_000,
        },
    )
    await fe.admin_ok(
        "deploy_model",
        {
            "model_name": MODEL,
            "model_version": "1",
            "input_type": "doubles",
            "artifact_path": artifact,
            "num_replicas": 2,
        },
        limit_s=120,
    )
    await fe.admin_ok("add_model_links", {"app_name": APP, "model_names": [MODEL]})

    # ensure 2 -> one Deployment of 2, its pods connected and answering.
    [dep] = await deployments(kubelet)
    assert dep["spec"]["replicas"] == 2
    assert dep["metadata"]["labels"]["clipper-serve/frontend"] == "fe-0"
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--fetch-artifact" in args and artifact not in args  # not the frontend's disk
    assert restricted_violations(dep["spec"]["template"]["spec"]) == []
    if HAS_VALIDATE:
        validate(as_applied(dep))
    [pdb] = await budgets(kubelet)
    assert pdb["metadata"]["name"] == dep["metadata"]["name"]
    assert pdb["spec"]["selector"] == dep["spec"]["selector"]
    assert pdb["spec"]["maxUnavailable"] == 1
    if HAS_VALIDATE:
        validate(as_applied(pdb))

    async def two_running() -> bool:
        rs = await replicas(fe)
        return len(rs) == 2 and all(r["state"] == "running" for r in rs)

    await wait_for(two_running, limit_s=60, interval=0.2, what="2 replicas running")
    rs = await replicas(fe)
    assert {r["location"] for r in rs} == {"local-kubelet"}
    assert await answered(url, 1.0)

    # scale to 1 under a closed loop: nothing fails; the drained pod is the one removed.
    failures: list[str] = []
    ok = 0
    stop = asyncio.Event()

    async def client(c: int) -> None:
        nonlocal ok
        i = 0
        while not stop.is_set():
            i += 1
            x = float(c * 100_000 + i)
            if await answered(url, x):
                ok += 1
            else:
                failures.append(f"{c}:{i}")

    clients = [asyncio.create_task(client(c)) for c in range(4)]
    try:
        await wait_for(lambda: ok >= 20, limit_s=30, what="the closed loop to run")
        await fe.admin_ok("set_num_replicas", {"model_name": MODEL, "num_replicas": 1}, limit_s=60)
        await wait_for(
            lambda: bool(kubelet.removed), limit_s=60, interval=0.1, what="a pod removed"
        )
        before = ok
        await wait_for(lambda: ok >= before + 50, limit_s=60, what="serving on after it")
    finally:
        stop.set()
        await asyncio.gather(*clients)
    assert failures == [], failures[:5]
    [gone] = kubelet.removed
    assert kubelet.costs[gone] == -1000  # the pod the manager marked went, not another
    [dep] = await deployments(kubelet)
    assert dep["spec"]["replicas"] == 1
    [left] = await replicas(fe)
    assert left["model_name"] == MODEL

    # a replica process SIGKILLed: restarted, and the restart reported.
    [pod] = kubelet.pods[dep["metadata"]["name"]]
    os.kill(pod.proc.pid, signal.SIGKILL)

    async def restarted() -> bool:
        rs = await replicas(fe)
        return len(rs) == 1 and rs[0]["restarts"] == 1 and rs[0]["state"] == "running"

    await wait_for(restarted, limit_s=60, interval=0.2, what="the restart reported")
    assert await answered(url, 3.0)

    # a frontend that stops takes its Deployments with it.
    await asyncio.to_thread(fe.stop)
    assert await deployments(kubelet) == []
    assert await budgets(kubelet) == []
