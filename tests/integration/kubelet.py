"""A small local "kubelet" for tests: runs the pods of the Deployments an API server holds as
local processes, from the container command, arguments, environment and volumes those
Deployments declare.

It stands in for the control loop a real cluster runs (Deployment controller + scheduler +
kubelet) closely enough that a query can be answered end to end through manifests that
clipper-serve's Kubernetes manager rendered and created:

* one process per wanted replica; ``$(VAR)`` references in arguments and environment expanded
  (``POD_NAME`` from the downward API); ``python`` is this interpreter;
* Secret volumes written to a private directory per pod (mode from ``defaultMode``),
  ``emptyDir`` volumes as empty directories; arguments naming a mount path point there;
* each declared ``containerPort`` mapped to a free local port (pods share this host's network,
  unlike a cluster), arguments equal to the port number rewritten;
* a Pod object per process in the API server, ``Running``, ``ready`` from the container's
  HTTP readiness probe, ``restartCount`` counted when a process dies and is restarted;
* a scale-down removes the pods with the lowest ``controller.kubernetes.io/pod-deletion-cost``
  first (then the newest), as the ReplicaSet controller does, with SIGTERM, the grace period,
  then SIGKILL.

Not emulated: scheduling onto nodes, image pulls, liveness restarts, resource limits.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tests.integration.helpers import request
from tests.integration.redis_server import free_port

_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_COST = "controller.kubernetes.io/pod-deletion-cost"


@dataclass
class LocalPod:
    name: str
    deployment: str
    proc: subprocess.Popen[bytes]
    argv: list[str]
    env: dict[str, str]
    ready_port: int | None
    log: Path
    restarts: int = 0
    last_exit: int | None = None
    ready: bool = False
    serial: int = 0
    stopping: bool = field(default=False)


class LocalKubelet:
    def __init__(self, api: str, namespace: str, workdir: Path) -> None:
        self.api = api.rstrip("/")
        self.ns = namespace
        self.workdir = workdir
        self.pods: dict[str, list[LocalPod]] = {}
        self.started = 0
        self.removed: list[str] = []  # pod names, in the order they were stopped
        self.costs: dict[str, int] = {}  # pod-deletion-cost of each pod chosen for a scale-down
        self._serial = itertools.count()
        self._task: asyncio.Task[None] | None = None

    # -- the API ---------------------------------------------------------------------------
    async def _get(self, path: str) -> Any:
        resp = await request(f"{self.api}{path}", limit_s=5.0)
        if resp.status == 404:
            return None
        assert resp.status == 200, (path, resp.status, resp.body[:300])
        return orjson.loads(resp.body)

    async def _send(self, method: str, path: str, doc: Any) -> None:
        ctype = "application/merge-patch+json" if method == "PATCH" else "application/json"
        resp = await request(
            f"{self.api}{path}",
            method,
            orjson.dumps(doc),
            headers={"Content-Type": ctype},
            limit_s=5.0,
        )
        assert resp.status < 300 or method == "DELETE", (method, path, resp.status, resp.body)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="local-kubelet")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for pods in self.pods.values():
            for pod in pods:
                _kill(pod.proc)

    async def _run(self) -> None:
        while True:
            await self.reconcile()
            await asyncio.sleep(0.1)

    async def reconcile(self) -> None:
        listing = await self._get(f"/apis/apps/v1/namespaces/{self.ns}/deployments")
        wanted = {d["metadata"]["name"]: d for d in (listing or {}).get("items", [])}
        for name in list(self.pods):
            if name not in wanted:
                for pod in list(self.pods[name]):
                    await self._remove(pod)
                del self.pods[name]
        for name, dep in wanted.items():
            pods = self.pods.setdefault(name, [])
            want = int(dep["spec"].get("replicas") or 0)
            while len(pods) < want:
                pods.append(await self._create(dep))
            if len(pods) > want:
                for pod in await self._victims(pods, len(pods) - want):
                    pods.remove(pod)
                    await self._remove(pod)
            for pod in pods:
                await self._tend(pod, dep)

    async def _victims(self, pods: list[LocalPod], n: int) -> list[LocalPod]:
        costs: dict[str, int] = {}
        for pod in pods:
            obj = await self._get(f"/api/v1/namespaces/{self.ns}/pods/{pod.name}")
            ann = ((obj or {}).get("metadata") or {}).get("annotations") or {}
            costs[pod.name] = int(ann.get(_COST, "0"))
        chosen = sorted(pods, key=lambda p: (costs[p.name], not p.ready, -p.serial))[:n]
        self.costs |= {p.name: costs[p.name] for p in chosen}
        return chosen

    # -- one pod -----------------------------------------------------------------------------
    async def _create(self, dep: dict[str, Any]) -> LocalPod:
        name = f"{dep['metadata']['name']}-{os.urandom(3).hex()}"
        template = dep["spec"]["template"]
        spec = template["spec"]
        [container] = spec["containers"]
        root = self.workdir / name
        mounts = await self._volumes(root, spec.get("volumes", []))
        env: dict[str, str] = {}
        for e in container.get("env", []):
            if "valueFrom" in e:
                assert e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", e
                env[e["name"]] = name
            else:
                env[e["name"]] = _expand(e["value"], env)
        ports = {str(p["containerPort"]): str(free_port()) for p in container.get("ports", [])}
        paths = {m["mountPath"]: str(mounts[m["name"]]) for m in container.get("volumeMounts", [])}
        argv = [*container.get("command", []), *container.get("args", [])]
        argv = [ports.get(a, paths.get(a, _expand(a, env))) for a in argv]
        if argv[0] == "python":
            argv[0] = sys.executable
        ready_port = None
        probe = (container.get("readinessProbe") or {}).get("httpGet")
        if probe is not None:
            named = {p.get("name"): str(p["containerPort"]) for p in container.get("ports", [])}
            target = str(probe["port"])
            ready_port = int(ports[named.get(target, target)])
        log = root / "container.log"
        pod = LocalPod(
            name, dep["metadata"]["name"], _spawn(argv, env, log), argv, env, ready_port, log
        )
        pod.serial = next(self._serial)
        self.started += 1
        await self._send(
            "POST",
            f"/api/v1/namespaces/{self.ns}/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": self.ns,
                    "labels": template["metadata"].get("labels", {}),
                    "annotations": template["metadata"].get("annotations", {}),
                    "creationTimestamp": f"2026-01-01T00:00:{pod.serial % 60:02d}Z",
                },
                "spec": {"nodeName": "local-kubelet"} | spec,
                "status": _status(False, 0, None),
            },
        )
        return pod

    async def _volumes(self, root: Path, volumes: list[dict[str, Any]]) -> dict[str, Path]:
        out: dict[str, Path] = {}
        for v in volumes:
            path = root / "volumes" / v["name"]
            path.mkdir(parents=True, exist_ok=True)
            out[v["name"]] = path
            if "secret" in v:
                name = v["secret"]["secretName"]
                secret = await self._get(f"/api/v1/namespaces/{self.ns}/secrets/{name}")
                assert secret is not None, f"Secret {name} does not exist"
                files = {k: base64.b64decode(val) for k, val in secret.get("data", {}).items()}
                files |= {k: val.encode() for k, val in secret.get("stringData", {}).items()}
                for fname, data in files.items():
                    (path / fname).write_bytes(data)
                    (path / fname).chmod(v["secret"].get("defaultMode", 0o644))
                path.chmod(0o700)
        return out

    async def _tend(self, pod: LocalPod, dep: dict[str, Any]) -> None:
        """Restart a process that died (counted); report readiness from the probe."""
        changed = False
        if pod.proc.poll() is not None and not pod.stopping:
            pod.restarts += 1
            pod.last_exit = pod.proc.returncode
            pod.proc = _spawn(pod.argv, pod.env, pod.log)
            pod.ready = False
            changed = True
        ready = await _probe(pod.ready_port) if pod.ready_port is not None else True
        if ready != pod.ready:
            pod.ready = ready
            changed = True
        if changed:
            await self._send(
                "PATCH",
                f"/api/v1/namespaces/{self.ns}/pods/{pod.name}",
                {"status": _status(pod.ready, pod.restarts, pod.last_exit)},
            )

    async def _remove(self, pod: LocalPod) -> None:
        pod.stopping = True
        if pod.proc.poll() is None:
            pod.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.to_thread(pod.proc.wait), 30.0)
            except TimeoutError:
                _kill(pod.proc)
        self.removed.append(pod.name)
        await self._send("DELETE", f"/api/v1/namespaces/{self.ns}/pods/{pod.name}", {})


def _expand(text: str, env: dict[str, str]) -> str:
    return _REF.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def _spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    full = dict(os.environ) | env
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=full)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


async def _probe(port: int) -> bool:
    try:
        resp = await request(f"http://127.0.0.1:{port}/ready", limit_s=1.0)
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        return False
    return resp.status == 200


def _status(ready: bool, restarts: int, last_exit: int | None) -> dict[str, Any]:
    cs: dict[str, Any] = {
        "name": "model",
        "ready": ready,
        "restartCount": restarts,
        "state": {"running": {}},
    }
    if last_exit is not None:
        cs["lastState"] = {"terminated": {"exitCode": last_exit}}
    return {"phase": "Running", "containerStatuses": [cs]}
