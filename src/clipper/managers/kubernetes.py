"""The Kubernetes container manager (``--manager k8s://NAMESPACE?...``): one Deployment per
model version for the whole deployment, created, scaled and deleted through the API server by
the replica owner (the one frontend the reconciler lets call :meth:`ensure`).

A Deployment is named from the model and the version only, so whichever frontend asks — two
at once, a restarted one, a new owner after a handover — finds the same one and adopts it: the
same spec hash (nothing in it names the asking frontend) changes nothing, a different count
only scales it. Its pods dial every frontend (``frontends=N``: the StatefulSet's pods by DNS
name; ``frontend=tcp://HOST:PORT``: given addresses; neither: the frontend that creates it) with
the replica key, and fetch their artifact from the first. A scale-down first marks the pods
that are to go with the lowest ``controller.kubernetes.io/pod-deletion-cost`` (not-ready ones,
then the newest), so the ReplicaSet removes exactly those; each drains on SIGTERM. Each
Deployment has a PodDisruptionBudget of the same name (one pod evicted at a time), made and
deleted with it.

A frontend that stops leaves the Deployments running (the next owner, or the same frontend
restarted, adopts them). They go when their version is deleted or scaled to zero
(``ensure(mv, 0)``), or all at once with ``clipper k8s delete-replicas``.

The official ``kubernetes`` client blocks: every call runs in a worker thread, never on the
event loop. Pods are listed by an owned poller every ``poll_s`` for ``clipper status``.

URL parameters: ``image``, ``cpu``, ``memory``, ``gpus``, ``drain_timeout``, ``pull_policy``,
``uid`` (the pods' non-root user), ``frontends`` (the frontends' StatefulSet size),
``frontend`` (repeatable, or comma-separated: the frontends' RPC addresses);
``api=URL`` talks to that API server without credentials (``kubectl proxy``, an emulator);
``context=NAME`` picks a kubeconfig context; otherwise the in-cluster service account is used
when there is one, else the default kubeconfig.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

from clipper.clock import Clock, MonotonicClock, sleep
from clipper.errors import ConfigError, ReplicaError
from clipper.kube.manifests import (
    ANNOTATION_MODEL,
    ANNOTATION_VERSION,
    CLIENT_KEYS_SECRET,
    LABEL_MODEL,
    LABEL_VERSION,
    REPLICA_LABELS,
    KubeSettings,
    ReplicaSpec,
    dns_label,
    frontend_addresses,
    replica_budget,
    replica_deployment,
    replica_deployment_name,
)
from clipper.registry import ModelVersion

__all__ = ["KubernetesManager", "PodReplica", "delete_replicas", "parse_url"]

log = logging.getLogger("clipper.manager.k8s")

_SPEC_HASH = "clipper-serve/spec-hash"
_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
# What an earlier clipper-serve labelled its per-frontend Deployments with: ensure replaces them.
_LEGACY_FRONTEND = "clipper-serve/frontend"
_PARAMS = {
    "image", "cpu", "memory", "gpus", "drain_timeout", "pull_policy", "uid", "api", "context",
    "frontends", "frontend",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class PodReplica:
    """A replica pod as the last listing saw it."""

    model: str
    version: str
    slot: int
    token: str  # the pod's name: what the container presents (--replica-token)
    restarts: int
    last_exit: int | None
    state: str
    location: str
    pid: int | None = None

    def log_tail(self, lines: int = 20) -> str:
        return f"(in the cluster: kubectl logs {self.token} --tail {lines})"


def parse_url(rest: str) -> tuple[KubeSettings, dict[str, str]]:
    """``NAMESPACE?key=value&...`` -> the replica settings and the connection options."""
    parts = urlsplit(f"k8s://{rest}")
    namespace = parts.netloc or "clipper"
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(query) - _PARAMS)
    if unknown:
        raise ConfigError(
            f"unknown k8s:// parameter(s) {', '.join(unknown)}; expected some of "
            f"{', '.join(sorted(_PARAMS))}"
        )
    q = {k: v[-1] for k, v in query.items()}
    try:
        gpus = int(q.get("gpus", "0"))
        drain = float(q.get("drain_timeout", "20"))
        uid = int(q.get("uid", str(KubeSettings().run_as_user)))
        pods = int(q.get("frontends", "0"))
    except ValueError as e:
        raise ConfigError(f"k8s://{rest}: {e}") from None
    if "frontends" in q and pods < 1:
        raise ConfigError(f"k8s://{rest}: frontends must be >= 1, got {pods}")
    dial = tuple(a for v in query.get("frontend", []) for a in v.split(",") if a)
    if pods and dial:
        raise ConfigError(f"k8s://{rest}: give frontends=N or frontend=ADDRESS, not both")
    defaults = KubeSettings()
    settings = KubeSettings(
        frontend_pods=pods,
        dial=dial,
        namespace=namespace,
        image=q.get("image", defaults.image),
        replica_cpu=q.get("cpu", defaults.replica_cpu),
        replica_memory=q.get("memory", defaults.replica_memory),
        replica_gpus=gpus,
        drain_timeout_s=drain,
        image_pull_policy=q.get("pull_policy", defaults.image_pull_policy),
        run_as_user=uid,
    )
    conn: dict[str, str] = {k: q[k] for k in ("api", "context") if k in q}
    return settings, conn


def _api_client(conn: dict[str, str]) -> Any:
    try:
        import kubernetes  # an optional extra
    except ImportError:
        raise ConfigError(
            "the k8s:// manager needs the kubernetes client: "
            "pip install 'clipper-serve[kubernetes]'"
        ) from None
    # Untyped (no stubs): Any, so that mypy is the same with it installed or not.
    k8s: Any = kubernetes
    client, config = k8s.client, k8s.config
    if "api" in conn:
        cfg = client.Configuration()
        cfg.host = conn["api"]
        return client.ApiClient(cfg)
    try:
        if "context" not in conn:
            with contextlib.suppress(config.ConfigException):
                config.load_incluster_config()
                return client.ApiClient()
        config.load_kube_config(context=conn.get("context"))
    except config.ConfigException as e:
        raise ConfigError(f"k8s:// cannot find the cluster: {e}") from None
    return client.ApiClient()


class KubernetesManager:
    def __init__(
        self,
        settings: KubeSettings,
        conn: dict[str, str],
        *,
        rpc_host: Callable[[], str],
        rpc_port: Callable[[], int],
        rpc_keys: Path | None,
        heartbeat_interval_s: float,
        drain: Callable[[str], Awaitable[None]] | None,
        poll_s: float = 2.0,
        clock: Clock | None = None,
    ) -> None:
        self.clock: Clock = clock or MonotonicClock()
        self.settings = settings
        self._conn = conn
        self._rpc_host = rpc_host
        self._rpc_port = rpc_port
        self._rpc_keys = rpc_keys
        self._heartbeat = heartbeat_interval_s
        self._drain = drain
        self._poll_s = poll_s
        self._api: Any = None
        self._apps: Any = None
        self._core: Any = None
        self._policy: Any = None
        self._pods: list[PodReplica] = []
        self._poller: asyncio.Task[None] | None = None
        self._secret_ready = False
        self._lock = asyncio.Lock()  # one API conversation at a time: counts stay consistent

    # -- the API, off the loop -----------------------------------------------------------------
    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    def _connect(self) -> None:
        if self._api is None:
            import kubernetes

            client: Any = kubernetes.client
            self._api = _api_client(self._conn)
            self._apps = client.AppsV1Api(self._api)
            self._core = client.CoreV1Api(self._api)
            self._policy = client.PolicyV1Api(self._api)

    async def _read(self, fn: Callable[..., Any], *args: Any) -> Any | None:
        """The object, or None when the API server says 404."""
        from kubernetes.client.exceptions import ApiException

        try:
            return await self._call(fn, *args, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                return None
            raise ReplicaError(f"the Kubernetes API refused a read: {e.status} {e.reason}") from e

    # -- ContainerManager ----------------------------------------------------------------------
    async def ensure(self, mv: ModelVersion, replicas: int) -> None:
        from kubernetes.client.exceptions import ApiException

        async with self._lock:
            self._connect()
            self._start_poller()
            ns = self.settings.namespace
            name = replica_deployment_name(mv.name, mv.version)
            try:
                current = await self._deployment(name)
                if replicas == 0:
                    if current is not None:
                        await self._drain_pods(mv, len(self._pods_of(mv)))
                        await self._call(self._apps.delete_namespaced_deployment, name, ns)
                    await self._delete_budget(name)
                    await self._replace_legacy(mv, name)
                    return
                await self._ensure_secret()
                body = replica_deployment(self.settings, self._spec(mv, replicas))
                digest = _spec_hash(body)
                body["metadata"]["annotations"][_SPEC_HASH] = digest
                # Before the Deployment: its pods are never without their budget.
                await self._ensure_budget(body)
                if current is None:
                    current = await self._create(body)
                if current is None:
                    log.info("created Deployment %s/%s (%d replicas)", ns, name, replicas)
                else:
                    await self._adopt(mv, current, body, replicas)
                await self._replace_legacy(mv, name)
            except ApiException as e:
                raise ReplicaError(
                    f"the Kubernetes API refused a change to Deployment {ns}/{name}: "
                    f"{e.status} {e.reason}"
                ) from e

    async def _deployment(self, name: str) -> dict[str, Any] | None:
        raw = await self._read(self._apps.read_namespaced_deployment, name, self.settings.namespace)
        found: dict[str, Any] | None = orjson.loads(raw.data) if raw is not None else None
        return found

    async def _create(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create the Deployment; None when made, else the one another frontend made first
        (both read it missing): it is adopted like any found."""
        from kubernetes.client.exceptions import ApiException

        ns = self.settings.namespace
        try:
            await self._call(self._apps.create_namespaced_deployment, ns, body)
        except ApiException as e:
            if e.status != 409:
                raise
            found = await self._deployment(body["metadata"]["name"])
            if found is None:
                raise
            return found
        return None

    async def _adopt(
        self, mv: ModelVersion, current: dict[str, Any], body: dict[str, Any], replicas: int
    ) -> None:
        """A Deployment found: the same spec hash -> at most a scale (no pod restarts), else
        the new spec (a rolling update)."""
        ns, name = self.settings.namespace, body["metadata"]["name"]
        have = int(current.get("spec", {}).get("replicas") or 0)
        if replicas < have:
            await self._drain_pods(mv, have - replicas)
        found = (current["metadata"].get("annotations") or {}).get(_SPEC_HASH)
        if found != body["metadata"]["annotations"][_SPEC_HASH]:
            # The spec rewritten whole: a strategic merge (the client's default for a dict)
            # would keep what the new spec no longer has (an env var, a volume, a GPU limit).
            patch = {
                "metadata": {k: body["metadata"][k] for k in ("labels", "annotations")},
                "spec": _merge_patch(current.get("spec") or {}, body["spec"]),
            }
            await self._call(
                self._apps.patch_namespaced_deployment,
                name,
                ns,
                patch,
                _content_type="application/merge-patch+json",
            )
            log.info("Deployment %s/%s: new spec, %d -> %d replicas", ns, name, have, replicas)
        elif replicas != have:
            await self._call(
                self._apps.patch_namespaced_deployment_scale,
                name,
                ns,
                {"spec": {"replicas": replicas}},
            )
            log.info("Deployment %s/%s: %d -> %d replicas", ns, name, have, replicas)

    async def _replace_legacy(self, mv: ModelVersion, name: str) -> None:
        """Delete what an earlier clipper-serve made for ``mv``: one Deployment per frontend
        (labelled with it), now replaced by the deployment's one."""
        labels = REPLICA_LABELS | {
            LABEL_MODEL: dns_label(mv.name),
            LABEL_VERSION: dns_label(mv.version),
        }
        found = await self._list_deployments(labels)
        for d in found:
            meta = d["metadata"]
            ann = meta.get("annotations") or {}
            if (
                meta["name"] != name
                and _LEGACY_FRONTEND in (meta.get("labels") or {})
                and (ann.get(ANNOTATION_MODEL), ann.get(ANNOTATION_VERSION))
                == (mv.name, mv.version)
            ):
                await self._delete_deployment(meta["name"])
                log.info("deleted per-frontend Deployment %s (replaced by %s)", meta["name"], name)

    async def _list_deployments(self, labels: dict[str, str]) -> list[dict[str, Any]]:
        raw = await self._call(
            self._apps.list_namespaced_deployment,
            self.settings.namespace,
            label_selector=_selector(labels),
            _preload_content=False,
        )
        # The API server filters by the selector already; this guards against one that does not.
        return [
            d
            for d in orjson.loads(raw.data).get("items", [])
            if labels.items() <= (d["metadata"].get("labels") or {}).items()
        ]

    async def _delete_deployment(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            await self._call(self._apps.delete_namespaced_deployment, name, self.settings.namespace)
        except ApiException as e:
            if e.status != 404:
                raise
        await self._delete_budget(name)

    def _frontends(self) -> tuple[str, ...]:
        s = self.settings
        if s.dial:
            return s.dial
        if s.frontend_pods:
            return frontend_addresses(s, s.frontend_pods, self._rpc_port())
        return (f"tcp://{self._rpc_host()}:{self._rpc_port()}",)

    def _spec(self, mv: ModelVersion, replicas: int) -> ReplicaSpec:
        return ReplicaSpec(
            frontends=self._frontends(),
            model=mv.name,
            version=mv.version,
            input_type=mv.input_type.readable,
            replicas=replicas,
            heartbeat_interval_s=self._heartbeat,
            auth=self._rpc_keys is not None,
        )

    def _pods_of(self, mv: ModelVersion) -> list[PodReplica]:
        return [p for p in self._pods if p.model == mv.name and p.version == mv.version]

    async def _drain_pods(self, mv: ModelVersion, count: int) -> None:
        """Drain ``count`` pods of ``mv`` (the not-ready ones first, then the newest) and mark
        them as the ReplicaSet's first choice to delete."""
        await self._refresh()
        pods = sorted(self._pods_of(mv), key=lambda p: (p.state == "running", -p.slot))
        for pod in pods[:count]:
            with contextlib.suppress(Exception):
                await self._call(
                    self._core.patch_namespaced_pod,
                    pod.token,
                    self.settings.namespace,
                    {"metadata": {"annotations": {_DELETION_COST: "-1000"}}},
                )

    async def _ensure_budget(self, deployment: dict[str, Any]) -> None:
        """The Deployment's PodDisruptionBudget, made when missing (an adopted Deployment made
        before budgets existed gets one too); its selector never changes, so an existing one
        stays as it is."""
        name = deployment["metadata"]["name"]
        ns = self.settings.namespace
        read = self._policy.read_namespaced_pod_disruption_budget
        if await self._read(read, name, ns) is None:
            from kubernetes.client.exceptions import ApiException

            body = replica_budget(self.settings, deployment)
            try:
                await self._call(self._policy.create_namespaced_pod_disruption_budget, ns, body)
            except ApiException as e:
                if e.status != 409:  # another frontend made it since: the same budget
                    raise

    async def _delete_budget(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            await self._call(
                self._policy.delete_namespaced_pod_disruption_budget, name, self.settings.namespace
            )
        except ApiException as e:
            if e.status != 404:
                raise

    async def _ensure_secret(self) -> None:
        """The replicas' key Secret (server public key, client secret key), made from this
        frontend's key directory when it does not exist (``clipper k8s render`` makes it too)."""
        if self._secret_ready or self._rpc_keys is None:
            return
        ns = self.settings.namespace
        if await self._read(self._core.read_namespaced_secret, CLIENT_KEYS_SECRET, ns) is None:
            files = ("server.key", "client.key_secret")
            data = {f: (self._rpc_keys / f).read_text() for f in files}
            from kubernetes.client.exceptions import ApiException

            try:
                await self._call(
                    self._core.create_namespaced_secret,
                    ns,
                    {
                        "apiVersion": "v1",
                        "kind": "Secret",
                        "metadata": {"name": CLIENT_KEYS_SECRET, "namespace": ns},
                        "type": "Opaque",
                        "stringData": data,
                    },
                )
            except ApiException as e:
                if e.status != 409:  # another frontend made it since (the same keys)
                    raise
        self._secret_ready = True

    async def stop_all(self) -> None:
        """The frontend stops: its pod listing and API connection go, the replica Deployments
        stay (the next owner, or this frontend restarted, adopts them by name)."""
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
        if self._api is None:
            return
        async with self._lock:
            await self._call(self._api.close)
            self._api = None

    def replicas(self, name: str, version: str) -> Sequence[PodReplica]:
        return [p for p in self._pods if p.model == name and p.version == version]

    def all_replicas(self) -> Sequence[PodReplica]:
        return list(self._pods)

    def logs(self, max_bytes: int) -> list[tuple[str, str]]:
        return []  # the pods' logs are the cluster's: kubectl logs

    def log_files(self, name: str, version: str) -> dict[int, Path] | None:
        return None  # likewise: `clipper logs` says to use kubectl logs

    async def forget(self, name: str, version: str) -> None:
        await asyncio.sleep(0)  # its Deployment went with ensure(..., 0); nothing kept here

    # -- the pod listing -----------------------------------------------------------------------
    def _start_poller(self) -> None:
        if self._poller is None:
            self._poller = asyncio.create_task(self._poll(), name="clipper-k8s-pods")

    async def _poll(self) -> None:
        while True:
            try:
                await self._refresh()
            except Exception as e:  # an API outage: keep the last listing, say so, retry
                log.warning("listing replica pods failed: %s", e)
            await sleep(self.clock, self._poll_s)

    async def _refresh(self) -> None:
        raw = await self._call(
            self._core.list_namespaced_pod,
            self.settings.namespace,
            label_selector=_selector(REPLICA_LABELS),
            _preload_content=False,
        )
        items = orjson.loads(raw.data).get("items", [])
        self._pods = pods_as_replicas([p for p in items if _is_replica(p["metadata"])])


def _selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _is_replica(meta: dict[str, Any]) -> bool:
    # The API server filters by the selector already; this guards against one that does not.
    return REPLICA_LABELS.items() <= (meta.get("labels") or {}).items()


def delete_replicas(settings: KubeSettings, conn: dict[str, str]) -> list[str]:
    """Delete every replica Deployment of the deployment in ``settings.namespace`` and its
    PodDisruptionBudget (``clipper k8s delete-replicas``: a frontend that stops leaves them);
    the names deleted. Blocking: for the command line, not the event loop."""
    api = _api_client(conn)  # first: it says how to install the client when it is missing
    import kubernetes
    from kubernetes.client.exceptions import ApiException

    client: Any = kubernetes.client
    try:
        apps, policy = client.AppsV1Api(api), client.PolicyV1Api(api)
        ns = settings.namespace
        raw = apps.list_namespaced_deployment(
            ns, label_selector=_selector(REPLICA_LABELS), _preload_content=False
        )
        names = sorted(
            d["metadata"]["name"]
            for d in orjson.loads(raw.data).get("items", [])
            if _is_replica(d["metadata"])
        )
        for name in names:
            for delete in (
                apps.delete_namespaced_deployment,
                policy.delete_namespaced_pod_disruption_budget,
            ):
                try:
                    delete(name, ns)
                except ApiException as e:
                    if e.status != 404:
                        raise ReplicaError(
                            f"the Kubernetes API refused to delete {ns}/{name}: "
                            f"{e.status} {e.reason}"
                        ) from e
        return names
    finally:
        api.close()


def pods_as_replicas(items: list[dict[str, Any]]) -> list[PodReplica]:
    """Pods (API JSON) as replica slots, numbered per model version by creation order."""
    out: list[PodReplica] = []
    slots: dict[tuple[str, str], int] = {}

    def created(p: dict[str, Any]) -> tuple[str, str]:
        return p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]

    for pod in sorted(items, key=created):
        meta = pod["metadata"]
        ann = meta.get("annotations") or {}
        model = ann.get("clipper-serve/model-name", "")
        version = ann.get("clipper-serve/model-version", "")
        slot = slots.get((model, version), 0)
        slots[(model, version)] = slot + 1
        status = pod.get("status") or {}
        cstatus = (status.get("containerStatuses") or [{}])[0]
        restarts = int(cstatus.get("restartCount") or 0)
        terminated = (cstatus.get("lastState") or {}).get("terminated") or {}
        last_exit = terminated.get("exitCode")
        out.append(
            PodReplica(
                model=model,
                version=version,
                slot=slot,
                token=meta["name"],
                restarts=restarts,
                last_exit=int(last_exit) if last_exit is not None else None,
                state=_pod_state(meta, status, cstatus, restarts),
                location=(pod.get("spec") or {}).get("nodeName") or "unscheduled",
            )
        )
    return out


def _pod_state(
    meta: dict[str, Any], status: dict[str, Any], cstatus: dict[str, Any], restarts: int
) -> str:
    if meta.get("deletionTimestamp"):
        return "stopping"
    if status.get("phase") == "Running" and cstatus.get("ready"):
        return "running"
    if restarts and "waiting" in (cstatus.get("state") or {}):
        return "restarting"
    return "starting"


def _merge_patch(have: Any, want: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns ``have`` into ``want``: a key ``want`` lacks
    is null (removed; the API server defaults again what it defaulted), lists and values are
    replaced whole, objects patched key by key."""
    if not isinstance(have, dict) or not isinstance(want, dict):
        return want
    patch: dict[str, Any] = dict.fromkeys(have.keys() - want.keys())
    for key, value in want.items():
        patch[key] = _merge_patch(have.get(key), value)
    return patch


def _spec_hash(body: dict[str, Any]) -> str:
    """What the Deployment should look like, apart from its replica count."""
    spec = dict(body["spec"])
    spec.pop("replicas", None)
    return hashlib.sha256(orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
