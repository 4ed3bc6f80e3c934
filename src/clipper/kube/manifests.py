"""Kubernetes objects for a clipper-serve deployment, as plain dicts (JSON/YAML ready).

Two kinds of object come from here:

* what ``clipper k8s render`` writes once, for ``kubectl apply``: the frontends (a StatefulSet,
  so each has a stable name, node id and DNS name that its replicas dial), their Services, the
  RBAC that lets a frontend manage its replicas' Deployments, the frontends' configuration
  (a ConfigMap of ``CLIPPER_*`` settings), the RPC keys (two Secrets: the frontends' and the
  replicas') and the admin token (a Secret), a PodDisruptionBudget, the NetworkPolicies and
  (``--artifacts-storage-class``) the frontends' shared artifacts volume;
* what the :class:`~clipper.managers.kubernetes.KubernetesManager` creates at run time: one
  Deployment per model version for the whole deployment (not per frontend), whose pods run
  ``python -m clipper.container`` in shared mode, dialing every frontend, with the artifact
  fetched from the first, a readiness probe on the container's ``/ready``, the replica key
  mounted from its Secret, and the frontend's resources settings; and its
  PodDisruptionBudget.

With more than one frontend, the artifacts every frontend serves live on one ReadWriteMany
volume (``--artifacts-storage-class``), mounted by each frontend at its state directory's
``uploads/`` and ``models/``: a replica fetches its artifact from whichever frontend it asks,
and that frontend has it whichever frontend it was uploaded to.

Every pod runs as a non-root user with a read-only root filesystem, no privilege escalation, no
capabilities and the runtime's default seccomp profile (Pod Security "restricted"); what a
process writes goes to an ``emptyDir`` (``/tmp``, the artifact cache) or the state volume.

Names follow DNS-1123 (lowercase, digits, '-', at most 63 characters): a model or version
name that does not fit is shortened and suffixed with a hash of the exact names, which are
kept in annotations.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from clipper.config import FrontendConfig
from clipper.errors import ConfigError

__all__ = [
    "ADMIN_CLIENT_LABEL",
    "ADMIN_TOKEN_SECRET",
    "ANNOTATION_MODEL",
    "ANNOTATION_VERSION",
    "ARTIFACTS_CLAIM",
    "CLIENT_KEYS_SECRET",
    "CONTAINER_READY_PORT",
    "LABEL_MODEL",
    "LABEL_VERSION",
    "MANAGED_BY",
    "REPLICA_LABELS",
    "SERVER_KEYS_SECRET",
    "KubeSettings",
    "ReplicaSpec",
    "admin_token_secret",
    "container_security",
    "dns_label",
    "frontend_addresses",
    "frontend_objects",
    "key_secrets",
    "network_policies",
    "pod_security",
    "replica_budget",
    "replica_deployment",
    "replica_deployment_name",
    "split_address",
]

MANAGED_BY = "clipper-serve"
# Every replica pod and Deployment of the deployment (whichever frontend created it).
REPLICA_LABELS = {
    "app.kubernetes.io/name": "clipper-replica",
    "app.kubernetes.io/managed-by": MANAGED_BY,
}
LABEL_MODEL = "clipper-serve/model"
LABEL_VERSION = "clipper-serve/version"
LABEL_SET = "clipper-serve/replica-set"
ANNOTATION_MODEL = "clipper-serve/model-name"
ANNOTATION_VERSION = "clipper-serve/model-version"
SERVER_KEYS_SECRET = "clipper-rpc-server-keys"
CLIENT_KEYS_SECRET = "clipper-rpc-client-keys"
ADMIN_TOKEN_SECRET = "clipper-admin-token"
# The ReadWriteMany claim the frontends share their artifacts on.
ARTIFACTS_CLAIM = "clipper-artifacts"
# The frontends' StatefulSet: its pods are <name>-0 .. <name>-(N-1).
FRONTEND_SET = "clipper-frontend"
# The pods (in the admin namespace) that the NetworkPolicy lets reach the admin port.
ADMIN_CLIENT_LABEL = "clipper-serve/admin-client"
KEYS_MOUNT = "/etc/clipper/rpc-keys"
STATE_MOUNT = "/var/lib/clipper"
# How long a replica pod waits with no frontend heard from before it exits. Long, unlike the
# container's default: its Deployment restarts it at once, so exiting cleans nothing up; short
# runs would only cycle it into the kubelet's restart back-off (up to 5 minutes, reset after 10
# minutes of running) and delay its return once a frontend is back.
_ORPHAN_TIMEOUT_S = 3600
# The state directory's artifact directories (clipper.runtime.artifacts): on the shared volume.
ARTIFACT_DIRS = ("uploads", "models")
CONTAINER_READY_PORT = 9100
# Owner read only: the RPC key loaders refuse secret files readable by others.
SECRET_MODE = 0o400

_NOT_DNS = re.compile(r"[^a-z0-9-]+")

# A frontend's stop drains its query ports for up to drain_timeout_s, then stops its replicas
# (their last batches, a few seconds): its pod's grace period covers both before SIGKILL.
_FRONTEND_DRAIN_S = FrontendConfig().drain_timeout_s
_FRONTEND_STOP_S = 10
# Before that, the frontend goes on accepting connections while not ready: the Service's
# endpoints drop a terminating pod asynchronously (kube-proxy and ingress controllers learn of
# it within a few seconds), and a connection refused meanwhile is a client error.
_FRONTEND_DRAIN_DELAY_S = 5


def dns_label(*parts: str, limit: int = 63) -> str:
    """``parts`` joined into a DNS-1123 label; shortened with a hash suffix when needed."""
    raw = "-".join(parts)
    label = _NOT_DNS.sub("-", raw.lower()).strip("-")
    if label == raw and len(label) <= limit:
        return label
    digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
    return f"{label[: limit - 9].rstrip('-')}-{digest}"


@dataclass(frozen=True, slots=True)
class KubeSettings:
    """The knobs of a deployment: ``clipper k8s render`` flags and ``k8s://`` URL parameters."""

    namespace: str = "clipper"
    # An image with Python, clipper-serve and the model frameworks (docs/scale-out.md).
    image: str = "clipper-serve:latest"
    frontends: int = 1
    # Shared config store; required by more than one frontend (each would have its own SQLite).
    store: str | None = None
    query_port: int = 1337
    admin_port: int = 1338
    rpc_port: int = 7000
    grpc_port: int = 8001
    state_size: str = "1Gi"
    # Each replica pod's resources (requests = limits for cpu and memory; GPUs are whole).
    replica_cpu: str = "1"
    replica_memory: str = "1Gi"
    replica_gpus: int = 0
    # The frontends' resources: a memory limit equal to the request, and by default no CPU
    # limit (Burstable): a CFS quota throttles the event loop mid-request, a tail-latency cost.
    # A CPU limit equal to the request makes the pods Guaranteed.
    frontend_cpu: str = "1"
    frontend_memory: str = "1Gi"
    frontend_cpu_limit: str | None = None
    # Every pod's user and group (the image's own user may be root: "restricted" refuses it).
    run_as_user: int = 10001
    # The namespace whose pods labelled ADMIN_CLIENT_LABEL=true may reach the admin port
    # (default: the deployment's own).
    admin_namespace: str | None = None
    drain_timeout_s: float = 20.0
    image_pull_policy: str = "IfNotPresent"
    extra_env: dict[str, str] = field(default_factory=dict)
    # The ReadWriteMany volume the frontends share their artifacts on (needed by more than one
    # frontend: a replica may fetch from a frontend the artifact was not uploaded to).
    artifacts_storage_class: str | None = None
    artifacts_size: str = "10Gi"
    # The manager's side (``k8s://`` parameters), what every replica dials: the frontends'
    # StatefulSet pods ``frontends=N`` (their DNS names), or these explicit ``tcp://host:port``
    # addresses (``frontend=``); neither: the frontend that creates the Deployment.
    frontend_pods: int = 0
    dial: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if dns_label(self.namespace) != self.namespace:
            raise ConfigError(f"namespace {self.namespace!r} is not a DNS-1123 label")
        if self.frontends < 1:
            raise ConfigError(f"frontends must be >= 1, got {self.frontends}")
        if self.frontends > 1 and not self.store:
            raise ConfigError(
                f"{self.frontends} frontends need a shared store (--store redis://...): "
                "each would otherwise keep its own SQLite configuration"
            )
        if self.frontends > 1 and not self.artifacts_storage_class:
            raise ConfigError(
                f"{self.frontends} frontends need a ReadWriteMany volume for the artifacts "
                "(--artifacts-storage-class CLASS: NFS, CephFS, EFS, Azure Files...): a replica "
                "fetches its artifact from a frontend it was not necessarily uploaded to"
            )
        if self.frontend_pods < 0:
            raise ConfigError(f"frontends must be >= 1, got {self.frontend_pods}")
        for address in self.dial:
            split_address(address)
        if self.replica_gpus < 0:
            raise ConfigError(f"replica GPUs must be >= 0, got {self.replica_gpus}")
        if self.run_as_user < 1:
            raise ConfigError(
                f"run_as_user must be a non-root uid (>= 1), got {self.run_as_user}: "
                'Pod Security "restricted" refuses root'
            )
        if self.admin_namespace is not None and dns_label(self.admin_namespace) != (
            self.admin_namespace
        ):
            raise ConfigError(f"admin namespace {self.admin_namespace!r} is not a DNS-1123 label")

    @property
    def frontend_service(self) -> str:
        """The headless Service that gives each frontend pod its DNS name."""
        return FRONTEND_SET

    def frontend_host(self, pod: str) -> str:
        """The DNS name of frontend pod ``pod``: what its replicas dial."""
        return f"{pod}.{self.frontend_service}.{self.namespace}.svc.cluster.local"


def split_address(address: str) -> tuple[str, int]:
    """``tcp://host:port`` -> (host, port); ConfigError when it is not one."""
    rest = address.removeprefix("tcp://")
    host, sep, port = rest.rpartition(":")
    if rest == address or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"frontend address {address!r} is not tcp://HOST:PORT")
    return host, int(port)


def frontend_addresses(s: KubeSettings, pods: int, rpc_port: int) -> tuple[str, ...]:
    """The RPC addresses of the StatefulSet's ``pods`` frontends, by their stable DNS names
    (the names each frontend advertises, so a replica told them by a frontend already has a
    link to each)."""
    return tuple(f"tcp://{s.frontend_host(f'{FRONTEND_SET}-{i}')}:{rpc_port}" for i in range(pods))


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """One model version's replica Deployment: the same whichever frontend asks for it (its
    hash decides whether a Deployment found is changed), so nothing here names one frontend
    unless the deployment has just one."""

    # The RPC addresses (tcp://host:port) every replica dials: the first is --ip/--port (and
    # where the artifact is fetched from), all of them CLIPPER_FRONTENDS.
    frontends: tuple[str, ...]
    model: str
    version: str
    input_type: str
    replicas: int
    heartbeat_interval_s: float = 1.0
    # The frontend checks CURVE keys (the default): mount the replica key Secret.
    auth: bool = True

    def __post_init__(self) -> None:
        if not self.frontends:
            raise ConfigError("a replica Deployment needs at least one frontend address")
        for address in self.frontends:
            split_address(address)


def _labels(model: str, version: str) -> dict[str, str]:
    return REPLICA_LABELS | {LABEL_MODEL: dns_label(model), LABEL_VERSION: dns_label(version)}


def replica_deployment_name(model: str, version: str) -> str:
    """Stable per (model, version) for the whole deployment: any frontend, restarted or newly
    the replica owner, finds the Deployment. A model name with a '-' is hashed into the name
    too, so that ("a-b", "c") and ("a", "b-c") never share one."""
    if "-" in model:
        digest = hashlib.sha256(f"{model}\0{version}".encode()).hexdigest()[:8]
        return dns_label("clipper", model, version, digest, limit=53)
    return dns_label("clipper", model, version, limit=53)


def _resources(s: KubeSettings) -> dict[str, Any]:
    amounts: dict[str, Any] = {"cpu": s.replica_cpu, "memory": s.replica_memory}
    limits = dict(amounts)
    if s.replica_gpus:
        limits["nvidia.com/gpu"] = str(s.replica_gpus)  # a quantity: the client refuses an int
    return {"requests": amounts, "limits": limits}


def pod_security(s: KubeSettings) -> dict[str, Any]:
    """The pod-level securityContext: a fixed non-root user, and its group on the volumes so
    that the state volume is writable and the Secret files readable (mode 0440, group-owned:
    the RPC key loaders accept a key handed over that way, docs/scale-out.md)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": s.run_as_user,
        "runAsGroup": s.run_as_user,
        "fsGroup": s.run_as_user,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security(s: KubeSettings) -> dict[str, Any]:
    """The container-level securityContext that Pod Security "restricted" requires, with a
    read-only root filesystem (writes go to the emptyDir at /tmp or a mounted volume)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": s.run_as_user,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


# With a read-only root: no bytecode written next to the sources, and a HOME (frameworks keep
# caches there: torch, matplotlib, sklearn's joblib) on the writable /tmp.
_WRITABLE_ENV = [
    {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
    {"name": "HOME", "value": "/tmp"},
]
_TMP_MOUNT = {"name": "tmp", "mountPath": "/tmp"}
_TMP_VOLUME = {"name": "tmp", "emptyDir": {}}


def replica_budget(s: KubeSettings, deployment: dict[str, Any]) -> dict[str, Any]:
    """The PodDisruptionBudget of a replica Deployment: a node drain evicts one of its pods at
    a time (each drains its batches on SIGTERM), never the whole version at once. One pod
    unavailable at most, not a minimum available, so a one-replica version does not block the
    drain of its node forever."""
    meta = deployment["metadata"]
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": meta["name"],
            "namespace": s.namespace,
            "labels": dict(meta["labels"]),
            "annotations": dict(meta["annotations"]),
        },
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": dict(deployment["spec"]["selector"]["matchLabels"])},
        },
    }


def replica_deployment(s: KubeSettings, r: ReplicaSpec) -> dict[str, Any]:
    """The Deployment that runs ``r.replicas`` containers of one model version for every
    frontend of the deployment. A pod dials each frontend over ZeroMQ with the replica key,
    fetches the artifact from the first (checksummed, cached in an emptyDir), and on SIGTERM —
    a scale-down or a delete — answers the batches it holds, tells each frontend it leaves
    and exits (the drain).

    The other frontends and shared mode go by environment (``CLIPPER_FRONTENDS``,
    ``CLIPPER_SHARED``), not by flags: an image whose container predates them still starts
    (and serves the first frontend) instead of refusing an unknown flag."""
    name = replica_deployment_name(r.model, r.version)
    labels = _labels(r.model, r.version) | {LABEL_SET: name}
    host, port = split_address(r.frontends[0])
    args = [
        "-m", "clipper.container",
        "--fetch-artifact",
        "--cache-dir", "/var/cache/clipper",
        "--name", r.model,
        "--version", r.version,
        "--input-type", r.input_type,
        "--ip", host,
        "--port", str(port),
        *(("--rpc-keys", KEYS_MOUNT) if r.auth else ()),
        "--replica-token", "$(POD_NAME)",
        "--heartbeat-interval", str(r.heartbeat_interval_s),
        "--ready-port", str(CONTAINER_READY_PORT),
        "--drain-timeout", str(s.drain_timeout_s),
    ]  # fmt: skip
    container: dict[str, Any] = {
        "name": "model",
        "image": s.image,
        "imagePullPolicy": s.image_pull_policy,
        "command": ["python"],
        "args": args,
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            # The frontends beyond --ip/--port (each dialed once); the frontends' FRONTENDS
            # messages bring the ones added later.
            *(
                [{"name": "CLIPPER_FRONTENDS", "value": ",".join(r.frontends[1:])}]
                if len(r.frontends) > 1
                else []
            ),
            # A pod is no frontend's child: it outlives a frontend's restart (adopted), and
            # exits (restarted by its Deployment) only when no frontend is heard from.
            {"name": "CLIPPER_SHARED", "value": "1"},
            {"name": "CLIPPER_ORPHAN_TIMEOUT_S", "value": str(_ORPHAN_TIMEOUT_S)},
            *_WRITABLE_ENV,
            *({"name": k, "value": v} for k, v in sorted(s.extra_env.items())),
        ],
        "ports": [{"name": "ready", "containerPort": CONTAINER_READY_PORT}],
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": "ready"},
            "periodSeconds": 2,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/live", "port": "ready"},
            "initialDelaySeconds": 10,
            "periodSeconds": 10,
        },
        "resources": _resources(s),
        "securityContext": container_security(s),
        "volumeMounts": [
            *([{"name": "rpc-keys", "mountPath": KEYS_MOUNT, "readOnly": True}] if r.auth else []),
            {"name": "artifacts", "mountPath": "/var/cache/clipper"},
            _TMP_MOUNT,
        ],
    }
    keys_volume = {
        "name": "rpc-keys",
        "secret": {"secretName": CLIENT_KEYS_SECRET, "defaultMode": SECRET_MODE},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": s.namespace,
            "labels": labels,
            "annotations": {ANNOTATION_MODEL: r.model, ANNOTATION_VERSION: r.version},
        },
        "spec": {
            "replicas": r.replicas,
            "selector": {"matchLabels": {LABEL_SET: name}},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {ANNOTATION_MODEL: r.model, ANNOTATION_VERSION: r.version},
                },
                "spec": {
                    # SIGTERM starts the drain; this is how long it may take before SIGKILL.
                    "terminationGracePeriodSeconds": int(s.drain_timeout_s) + 10,
                    "securityContext": pod_security(s),
                    # A replica talks to the frontends only; it needs no API credentials.
                    "automountServiceAccountToken": False,
                    "containers": [container],
                    "volumes": [
                        *([keys_volume] if r.auth else []),
                        {"name": "artifacts", "emptyDir": {}},
                        _TMP_VOLUME,
                    ],
                },
            },
        },
    }


def key_secrets(s: KubeSettings, keys: dict[str, str]) -> list[dict[str, Any]]:
    """The RPC keys (file name -> certificate text) as two Secrets: the frontends' (their
    secret key and the replicas' public key) and the replicas' (the frontends' public key and
    their own secret key), so a replica pod never holds the frontend's secret."""
    server = ("server.key", "server.key_secret", "client.key")
    client = ("server.key", "client.key_secret")
    missing = sorted(set(server + client) - keys.keys())
    if missing:
        raise ConfigError(f"RPC key files missing: {', '.join(missing)}")
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": s.namespace, "labels": _app("keys")},
            "type": "Opaque",
            "stringData": {f: keys[f] for f in files},
        }
        for name, files in ((SERVER_KEYS_SECRET, server), (CLIENT_KEYS_SECRET, client))
    ]


def _app(component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "clipper-serve",
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def admin_token_secret(s: KubeSettings, token: str) -> dict[str, Any]:
    """The admin API's bearer token, passed to the frontends by env (CLIPPER_ADMIN_TOKEN)."""
    if len(token) < 16:
        raise ConfigError("the admin token must be at least 16 characters")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": ADMIN_TOKEN_SECRET, "namespace": s.namespace, "labels": _app("keys")},
        "type": "Opaque",
        "stringData": {"token": token},
    }


def _frontend_resources(s: KubeSettings) -> dict[str, Any]:
    requests = {"cpu": s.frontend_cpu, "memory": s.frontend_memory}
    limits: dict[str, str] = {"memory": s.frontend_memory}
    if s.frontend_cpu_limit is not None:
        limits["cpu"] = s.frontend_cpu_limit
    return {"requests": requests, "limits": limits}


def network_policies(s: KubeSettings) -> list[dict[str, Any]]:
    """Ingress rules: the query and gRPC ports are open; the RPC port takes the deployment's
    replica pods only; the admin port takes only pods labelled ``ADMIN_CLIENT_LABEL=true`` in
    the admin namespace; the replicas' one port (readiness) takes the frontends only. Egress
    stays open (a model may call out; replicas dial their frontend). The kubelet's probes come
    from the node, which network plugins let through."""
    meta = {"namespace": s.namespace, "labels": _app("network")}
    frontends = {"podSelector": {"matchLabels": _app("frontend")}}
    replicas = {"podSelector": {"matchLabels": dict(REPLICA_LABELS)}}
    admins = {
        "namespaceSelector": {
            "matchLabels": {"kubernetes.io/metadata.name": s.admin_namespace or s.namespace}
        },
        "podSelector": {"matchLabels": {ADMIN_CLIENT_LABEL: "true"}},
    }

    def port(name: str) -> dict[str, Any]:
        return {"protocol": "TCP", "port": name}

    return [
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "clipper-frontend"} | meta,
            "spec": {
                "podSelector": frontends["podSelector"],
                "policyTypes": ["Ingress"],
                "ingress": [
                    {"ports": [port("query"), port("grpc")]},
                    {"from": [replicas], "ports": [port("rpc")]},
                    {"from": [admins], "ports": [port("admin")]},
                ],
            },
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "clipper-replica"} | meta,
            "spec": {
                "podSelector": replicas["podSelector"],
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [frontends], "ports": [port("ready")]}],
            },
        },
    ]


def frontend_objects(
    s: KubeSettings, keys: dict[str, str] | None, admin_token: str | None = None
) -> list[dict[str, Any]]:
    """Everything ``kubectl apply`` needs for the frontends, in apply order. ``keys`` None
    leaves the key Secrets out, ``admin_token`` None the admin token's: a re-render for a
    deployment that has them must not replace them (``clipper k8s render --keep-secrets``)."""
    ns = s.namespace
    sel = _app("frontend")
    manager = (
        f"k8s://{ns}?image={s.image}&cpu={s.replica_cpu}&memory={s.replica_memory}"
        f"&uid={s.run_as_user}"
    )
    if s.replica_gpus:
        manager += f"&gpus={s.replica_gpus}"
    # The replicas dial every frontend of the StatefulSet by its DNS name, whichever frontend
    # (the replica owner of the moment) creates their Deployment.
    manager += f"&frontends={s.frontends}"
    config = {
        "CLIPPER_HOST": "0.0.0.0",
        "CLIPPER_RPC_HOST": "0.0.0.0",
        # Reached through the clipper-admin Service; CLIPPER_ADMIN_TOKEN (from its Secret)
        # guards it, and the NetworkPolicy lets only the admin clients' pods in.
        "CLIPPER_ADMIN_HOST": "0.0.0.0",
        "CLIPPER_QUERY_PORT": str(s.query_port),
        "CLIPPER_ADMIN_PORT": str(s.admin_port),
        "CLIPPER_RPC_PORT": str(s.rpc_port),
        "CLIPPER_GRPC_PORT": str(s.grpc_port),
        "CLIPPER_STATE_DIR": STATE_MOUNT,
        "CLIPPER_RPC_KEYS_DIR": KEYS_MOUNT,
        "CLIPPER_MANAGER": manager,
        "CLIPPER_DRAIN_TIMEOUT_S": f"{_FRONTEND_DRAIN_S:g}",
        "CLIPPER_DRAIN_DELAY_S": str(_FRONTEND_DRAIN_DELAY_S),
    } | ({"CLIPPER_STORE": s.store} if s.store else {})
    rules = [
        {
            "apiGroups": ["apps"],
            "resources": ["deployments", "deployments/scale"],
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
        },
        # patch: a scale-down marks the pods it drained as the first to delete.
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create"]},
        # Each replica Deployment's PodDisruptionBudget, made and deleted with it.
        {
            "apiGroups": ["policy"],
            "resources": ["poddisruptionbudgets"],
            "verbs": ["get", "list", "create", "update", "patch", "delete"],
        },
    ]
    meta = {"namespace": ns, "labels": sel}
    container = {
        "name": "frontend",
        "image": s.image,
        "imagePullPolicy": s.image_pull_policy,
        "command": ["clipper", "start"],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            # Its id in the store (which unfinished changes are its own) and the name its
            # replicas dial: both follow the pod, stable across restarts in a StatefulSet.
            {"name": "CLIPPER_NODE_ID", "value": "$(POD_NAME)"},
            {
                "name": "CLIPPER_ADVERTISE_HOST",
                "value": s.frontend_host("$(POD_NAME)"),
            },
            {
                "name": "CLIPPER_ADMIN_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": ADMIN_TOKEN_SECRET, "key": "token"}},
            },
            *_WRITABLE_ENV,
        ],
        "envFrom": [{"configMapRef": {"name": "clipper-config"}}],
        "ports": [
            {"name": "query", "containerPort": s.query_port},
            {"name": "admin", "containerPort": s.admin_port},
            {"name": "rpc", "containerPort": s.rpc_port},
            {"name": "grpc", "containerPort": s.grpc_port},
        ],
        # Model errors do not take a frontend out of its Service: every frontend serves the same
        # models, so a failing model would take every application out (docs/query-api.md).
        "readinessProbe": {
            "httpGet": {"path": "/ready?ignore=model_errors", "port": "query"},
            "periodSeconds": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": "query"},
            "initialDelaySeconds": 10,
            "periodSeconds": 10,
        },
        "resources": _frontend_resources(s),
        "securityContext": container_security(s),
        "volumeMounts": [
            {"name": "state", "mountPath": STATE_MOUNT},
            # Over the state volume: the artifacts every frontend reads and writes.
            *(
                {"name": "artifacts", "mountPath": f"{STATE_MOUNT}/{sub}", "subPath": sub}
                for sub in (ARTIFACT_DIRS if s.artifacts_storage_class else ())
            ),
            {"name": "rpc-keys", "mountPath": KEYS_MOUNT, "readOnly": True},
            _TMP_MOUNT,
        ],
    }
    artifacts: list[dict[str, Any]] = []
    if s.artifacts_storage_class:
        artifacts = [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": ARTIFACTS_CLAIM} | meta,
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": s.artifacts_storage_class,
                    "resources": {"requests": {"storage": s.artifacts_size}},
                },
            }
        ]
    secrets = [
        *(key_secrets(s, keys) if keys is not None else []),
        *([admin_token_secret(s, admin_token)] if admin_token is not None else []),
    ]
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "clipper-frontend"} | meta,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "clipper-frontend"} | meta,
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "clipper-frontend"} | meta,
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "clipper-frontend",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "clipper-frontend", "namespace": ns}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "clipper-config"} | meta,
            "data": config,
        },
        *secrets,
        *artifacts,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": s.frontend_service} | meta,
            "spec": {
                "clusterIP": "None",  # headless: one DNS name per frontend pod
                "publishNotReadyAddresses": True,  # replicas must reach a starting frontend
                "selector": sel,
                "ports": [{"name": "rpc", "port": s.rpc_port, "targetPort": "rpc"}],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "clipper-query"} | meta,
            "spec": {
                "selector": sel,
                "ports": [
                    {"name": "query", "port": s.query_port, "targetPort": "query"},
                    {"name": "grpc", "port": s.grpc_port, "targetPort": "grpc"},
                ],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "clipper-admin"} | meta,
            "spec": {
                "selector": sel,
                "ports": [{"name": "admin", "port": s.admin_port, "targetPort": "admin"}],
            },
        },
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "clipper-frontend"} | meta,
            "spec": {
                "serviceName": s.frontend_service,
                "replicas": s.frontends,
                "selector": {"matchLabels": sel},
                "template": {
                    "metadata": {
                        "labels": sel,
                        # For a Prometheus that discovers pods by annotation: the query port
                        # serves /metrics (clipper_autoscale_desired_replicas among them).
                        "annotations": {
                            "prometheus.io/scrape": "true",
                            "prometheus.io/port": str(s.query_port),
                            "prometheus.io/path": "/metrics",
                        },
                    },
                    "spec": {
                        "serviceAccountName": "clipper-frontend",
                        "securityContext": pod_security(s),
                        # SIGTERM starts the drain (CLIPPER_DRAIN_DELAY_S and
                        # CLIPPER_DRAIN_TIMEOUT_S, above): raise them together.
                        "terminationGracePeriodSeconds": _FRONTEND_DRAIN_DELAY_S
                        + int(_FRONTEND_DRAIN_S)
                        + _FRONTEND_STOP_S,
                        "containers": [container],
                        "volumes": [
                            {
                                "name": "rpc-keys",
                                "secret": {
                                    "secretName": SERVER_KEYS_SECRET,
                                    "defaultMode": SECRET_MODE,
                                },
                            },
                            _TMP_VOLUME,
                            *(
                                [
                                    {
                                        "name": "artifacts",
                                        "persistentVolumeClaim": {"claimName": ARTIFACTS_CLAIM},
                                    }
                                ]
                                if artifacts
                                else []
                            ),
                        ],
                    },
                },
                "volumeClaimTemplates": [
                    {
                        "metadata": {"name": "state"},
                        "spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": s.state_size}},
                        },
                    }
                ],
            },
        },
        # A node drain (or a cluster upgrade) evicts one frontend at a time; each drains its
        # requests within its grace period while the others serve.
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "clipper-frontend"} | meta,
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": sel}},
        },
        *network_policies(s),
    ]
