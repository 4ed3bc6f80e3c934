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
* a frontend that stops leaves its Deployment and its pods running; restarted, it adopts them
  (the same pod serves, none is started); ``clipper k8s delete-replicas`` removes them.

And what shared replicas ask of it, with manager instances in this process (each one a
frontend) against the same emulator:

* two frontends ensuring the same versions at once -> one Deployment per version, whichever
  asks; its pods dial every frontend of the StatefulSet;
* a restarted frontend ensuring what exists writes nothing (the same spec hash: no pod churn);
* the owner handover: the second frontend, ensuring after the first stopped, scales the same
  Deployment (its template untouched) and deletes it with ``ensure(mv, 0)``;
* a different spec (fewer frontends) replaces the same Deployment's template whole;
* the per-frontend Deployments an earlier clipper-serve made are replaced.

Runs with ``-m k8s`` in ``.ci/run``'s Kubernetes environment (the ``[kubernetes]`` extra and
kmock); skipped elsewhere.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.integration.frontend_process import FrontendProcess
from tests.integration.helpers import predict, request, wait_for, write_row_sums
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
    assert dep["metadata"]["name"] == f"clipper-{MODEL}-1"  # not per frontend
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

    # a frontend that stops leaves its replicas running; restarted, it adopts them.
    started = kubelet.started
    await asyncio.to_thread(fe.stop)
    [kept] = await deployments(kubelet)
    assert kept["metadata"]["name"] == dep["metadata"]["name"]
    assert kept["spec"]["replicas"] == 1 and len(await budgets(kubelet)) == 1
    assert pod.proc.poll() is None  # the pod's process was not stopped
    await fe.start()
    await wait_for(lambda: answered(url, 4.0), limit_s=60, interval=0.2, what="answers again")

    async def adopted_running() -> bool:
        # The replica answers as soon as it reconnects; its state comes with the manager's
        # next poll of the pod.
        rs = await replicas(fe)
        return len(rs) == 1 and rs[0]["state"] == "running"

    await wait_for(adopted_running, limit_s=30, interval=0.2, what="the adopted one running")
    assert kubelet.started == started  # no new pod: the same one serves
    assert [p.name for p in kubelet.pods[dep["metadata"]["name"]]] == [pod.name]
    [same] = await deployments(kubelet)
    assert same["metadata"]["annotations"] == kept["metadata"]["annotations"]  # spec hash

    # the explicit removal.
    from clipper.cli import main

    rc = await asyncio.to_thread(
        main, ["k8s", "delete-replicas", "--namespace", NS, "--api", fe.api]
    )
    assert rc == 0
    assert await deployments(kubelet) == []
    assert await budgets(kubelet) == []
    await wait_for(lambda: pod.name in kubelet.removed, limit_s=60, what="its pod stopped")


# -- shared replicas: manager instances in this process, each one a frontend ---------------------


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[Any, str]]:
    import kmock

    async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator):
        emulator.resources["v1/pods"] = {}  # listed (empty) before any pod exists
        yield emulator, str(emulator.url).rstrip("/")


def frontend(api: str, keys: Path, *, host: str, dial: str = "frontends=2") -> Any:
    """The manager one frontend of a 2-pod StatefulSet builds (its own pod address; the RPC
    port is the ConfigMap's, the same for all)."""
    from clipper.managers.kubernetes import KubernetesManager, parse_url

    settings, conn = parse_url(f"{NS}?api={api}&image=clipper-serve:test&{dial}")
    return KubernetesManager(
        settings,
        conn,
        rpc_host=lambda: host,
        rpc_port=lambda: 7000,
        rpc_keys=keys,
        heartbeat_interval_s=0.5,
        drain=None,
    )


def version(v: str = "1") -> Any:
    from clipper.inputs import InputType
    from clipper.registry import ModelVersion

    return ModelVersion(MODEL, v, InputType.parse("doubles"))


def stored(emulator: Any, plural: str) -> dict[str, Any]:
    """The emulator's live objects of one resource kind, by name (with their write history)."""
    return {
        name: obj
        for (resource, ns, name), obj in emulator.objects.items()
        if resource.plural == plural and ns == NS and not obj.deleted
    }


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    from clipper.rpc.auth import ensure_keys

    ensure_keys(tmp_path / "keys")
    return tmp_path / "keys"


async def test_two_frontends_make_one_deployment_per_version(
    api: tuple[Any, str], keys: Path
) -> None:
    emulator, url = api
    fe0, fe1 = frontend(url, keys, host="10.0.0.1"), frontend(url, keys, host="10.0.0.2")
    try:
        # Both at once (each reads it missing, one create loses with 409 and adopts).
        await asyncio.gather(fe0.ensure(version("1"), 2), fe1.ensure(version("1"), 2))
        await fe1.ensure(version("2"), 1)
        await fe0.ensure(version("2"), 1)
    finally:
        await fe0.stop_all()
        await fe1.stop_all()
    deps = stored(emulator, "deployments")
    assert sorted(deps) == ["clipper-sums-1", "clipper-sums-2"]
    assert sorted(stored(emulator, "poddisruptionbudgets")) == sorted(deps)
    one = deps["clipper-sums-1"]
    assert one["spec"]["replicas"] == 2
    # The second ensure of version 2 found the first's Deployment as it wanted it: no write.
    assert len(deps["clipper-sums-2"].history) == 1
    [c] = one["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    fe_host = f"clipper-frontend-{{}}.clipper-frontend.{NS}.svc.cluster.local"
    assert args[args.index("--ip") + 1] == fe_host.format(0)
    assert args[args.index("--port") + 1] == "7000"
    assert env["CLIPPER_FRONTENDS"] == f"tcp://{fe_host.format(1)}:7000"
    assert env["CLIPPER_SHARED"] == "1"
    assert "clipper-serve/frontend" not in one["metadata"]["labels"]
    for obj in [*deps.values(), *stored(emulator, "poddisruptionbudgets").values()]:
        if obj["kind"] == "Deployment":
            assert restricted_violations(obj["spec"]["template"]["spec"]) == []
        if HAS_VALIDATE:
            validate(as_applied(copy.deepcopy(obj.raw)))


async def test_a_restarted_frontend_adopts_without_a_write(
    api: tuple[Any, str], keys: Path
) -> None:
    emulator, url = api
    first = frontend(url, keys, host="10.0.0.1")
    await first.ensure(version(), 2)
    await first.stop_all()
    [(name, dep)] = stored(emulator, "deployments").items()
    writes, before = len(dep.history), copy.deepcopy(dep.raw)
    assert len(stored(emulator, "poddisruptionbudgets")) == 1  # stop_all deleted nothing

    again = frontend(url, keys, host="10.0.0.1")
    try:
        await again.ensure(version(), 2)
    finally:
        await again.stop_all()
    dep = stored(emulator, "deployments")[name]
    assert len(dep.history) == writes  # not patched, not scaled: no pod restarted
    assert dep.raw == before


async def test_the_next_owner_scales_the_same_deployment(api: tuple[Any, str], keys: Path) -> None:
    emulator, url = api
    owner = frontend(url, keys, host="10.0.0.1")
    await owner.ensure(version(), 2)
    await owner.stop_all()  # it stops (or loses the lease): the replicas stay
    [(name, dep)] = stored(emulator, "deployments").items()
    template, writes = copy.deepcopy(dep.raw["spec"]["template"]), len(dep.history)
    spec_hash = dep["metadata"]["annotations"]["clipper-serve/spec-hash"]

    successor = frontend(url, keys, host="10.0.0.2")  # another frontend of the StatefulSet
    try:
        await successor.ensure(version(), 3)
        [(same, dep)] = stored(emulator, "deployments").items()
        assert same == name and dep["spec"]["replicas"] == 3
        assert len(dep.history) == writes + 1  # one write: the scale
        assert dep.raw["spec"]["template"] == template
        assert dep["metadata"]["annotations"]["clipper-serve/spec-hash"] == spec_hash
        # A version deleted (or scaled to zero): its Deployment and budget go.
        await successor.ensure(version(), 0)
        assert stored(emulator, "deployments") == {}
        assert stored(emulator, "poddisruptionbudgets") == {}
    finally:
        await successor.stop_all()


async def test_a_new_spec_replaces_the_template_of_the_same_deployment(
    api: tuple[Any, str], keys: Path
) -> None:
    """Re-rendered for one frontend and no GPU: the Deployment's spec is rewritten whole, the
    other frontend's address and the GPU limit gone (not merged into what was there)."""
    emulator, url = api
    two = frontend(url, keys, host="10.0.0.1", dial="frontends=2&gpus=1")
    await two.ensure(version(), 2)
    await two.stop_all()
    [(name, dep)] = stored(emulator, "deployments").items()
    old_hash = dep["metadata"]["annotations"]["clipper-serve/spec-hash"]
    [c] = dep.raw["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    one = frontend(url, keys, host="10.0.0.1", dial="frontends=1")
    try:
        await one.ensure(version(), 2)
    finally:
        await one.stop_all()
    [(same, dep)] = stored(emulator, "deployments").items()
    assert same == name
    assert dep["metadata"]["annotations"]["clipper-serve/spec-hash"] != old_hash
    [c] = dep.raw["spec"]["template"]["spec"]["containers"]
    assert "CLIPPER_FRONTENDS" not in {e["name"] for e in c["env"]}
    assert c["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}
    assert dep.raw["spec"]["replicas"] == 2
    if HAS_VALIDATE:
        validate(as_applied(copy.deepcopy(dep.raw)))


async def test_per_frontend_deployments_of_an_earlier_release_are_replaced(
    api: tuple[Any, str], keys: Path
) -> None:
    emulator, url = api
    from clipper.kube.manifests import KubeSettings, replica_deployment

    def legacy(frontend_id: str, v: str) -> dict[str, Any]:
        from clipper.kube.manifests import ReplicaSpec

        spec = ReplicaSpec(("tcp://old:7000",), MODEL, v, "doubles", 1)
        dep = replica_deployment(KubeSettings(namespace=NS), spec)
        dep["metadata"]["name"] = f"clipper-{frontend_id}-{MODEL}-{v}"
        dep["metadata"]["labels"]["clipper-serve/frontend"] = frontend_id
        return dep

    for old in (legacy("fe-0", "1"), legacy("fe-1", "1"), legacy("fe-0", "2")):
        path = f"/apis/apps/v1/namespaces/{NS}/deployments"
        resp = await request(
            f"{url}{path}", "POST", orjson.dumps(old), headers={"Content-Type": "application/json"}
        )
        assert resp.status < 300, resp.body
    fe = frontend(url, keys, host="10.0.0.1")
    try:
        await fe.ensure(version("1"), 1)
    finally:
        await fe.stop_all()
    # Version 1's two per-frontend Deployments went; version 2's waits for its own ensure.
    assert sorted(stored(emulator, "deployments")) == [
        "clipper-fe-0-sums-2",
        "clipper-sums-1",
    ]


async def test_delete_replicas_removes_every_replica_deployment(
    api: tuple[Any, str], keys: Path
) -> None:
    from clipper.managers.kubernetes import delete_replicas, parse_url

    emulator, url = api
    fe = frontend(url, keys, host="10.0.0.1")
    try:
        await fe.ensure(version("1"), 1)
        await fe.ensure(version("2"), 1)
    finally:
        await fe.stop_all()
    settings, conn = parse_url(f"{NS}?api={url}")
    deleted = await asyncio.to_thread(delete_replicas, settings, conn)
    assert deleted == ["clipper-sums-1", "clipper-sums-2"]
    assert stored(emulator, "deployments") == {}
    assert stored(emulator, "poddisruptionbudgets") == {}
    assert await asyncio.to_thread(delete_replicas, settings, conn) == []  # nothing left
