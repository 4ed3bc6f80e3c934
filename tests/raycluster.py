"""A real multi-node Ray cluster on this machine, for the ``ray``-marked tests.

``ray.cluster_utils.Cluster`` starts a head and worker nodes (each its own raylet and object
store) on 127.0.0.1. Ray binds some fixed ports (the dashboard agent's, for one), so the cluster
runs in a network namespace of its own when the tests run as root with ``ip`` available: the
test process's main thread joins it (``setns``) before the cluster starts, so everything started
afterwards (the nodes, the frontend's threads, the containers) shares that namespace's loopback;
it is left and deleted at the end. Without root it runs in the host's namespace.

The head is started with shorter node health checks than Ray's defaults (a check every 3 s, dead
after 5 failures, each allowed 10 s: about 15 s before a killed node is declared dead): every
1 s, dead after 3 failures, each allowed 2 s, so a removed node is declared dead in about 3 s
and the failover tests measure the manager, not Ray's patience. On a busy machine shorter
checks risk declaring a live node dead (docs/scale-out.md, "Node-death detection").
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["HEALTH_CHECKS", "RayCluster", "ray_cluster", "require_ray"]

_CLONE_NEWNET = 0x40000000
# Ray's system config for the head (the GCS runs the node health checks): see the docstring.
HEALTH_CHECKS = {
    "health_check_period_ms": 1000,
    "health_check_failure_threshold": 3,
    "health_check_timeout_ms": 2000,
}


def require_ray() -> Any:
    """The ray module, or skip the test saying why."""
    try:
        import ray
    except ImportError:
        pytest.skip(
            "Ray is not installed (pip install 'clipper-serve[ray]'; .ci/run runs these tests "
            "in a venv of their own with -m ray)"
        )
    return ray


def _setns(path: str) -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


@contextlib.contextmanager
def network_namespace() -> Iterator[str | None]:
    """Join a fresh network namespace (loopback up) for the duration; None when not possible."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        yield None
        return
    name = f"clipper-ray-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    original = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        _setns(f"/var/run/netns/{name}")
        try:
            yield name
        finally:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.setns(original, _CLONE_NEWNET)
    finally:
        os.close(original)
        subprocess.run(["ip", "netns", "delete", name], check=False)


class RayCluster:
    """The cluster: ``address`` for ``ray://``, ``add_node()``/``remove_node()``."""

    def __init__(self, cluster: Any, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def add_node(self, **resources: float) -> Any:
        """A worker with one CPU (and the custom ``resources`` given)."""
        return self.cluster.add_node(
            num_cpus=1, node_ip_address="127.0.0.1", resources=dict(resources)
        )

    def remove_node(self, node: Any) -> None:
        self.cluster.remove_node(node, allow_graceful=False)

    @property
    def workers(self) -> list[Any]:
        return list(self.cluster.worker_nodes)

    def manager_url(self, **params: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in {"namespace": self.namespace, **params}.items())
        return f"ray://{self.address}?{query}"

    def named_actors(self) -> list[str]:
        import ray.util

        return sorted(
            str(a["name"])
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a.get("namespace") == self.namespace
        )


@contextlib.contextmanager
def ray_cluster(nodes: int = 3) -> Iterator[RayCluster]:
    """A head and ``nodes - 1`` workers, one logical CPU each, and this process connected."""
    ray = require_ray()
    from ray.cluster_utils import Cluster

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    with network_namespace():
        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1",
                            "include_dashboard": False, "_system_config": HEALTH_CHECKS},
        )  # fmt: skip
        try:
            for _ in range(nodes - 1):
                cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
            namespace = f"clipper-test-{uuid.uuid4().hex[:6]}"
            ray.init(address=cluster.address, namespace=namespace, log_to_driver=False)
            try:
                yield RayCluster(cluster, namespace)
            finally:
                ray.shutdown()
        finally:
            cluster.shutdown()
