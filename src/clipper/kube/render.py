"""``clipper k8s render``: the manifests of a deployment, written once for ``kubectl apply``
(and the argument parser of ``clipper k8s delete-replicas``, which removes what the frontends
leave running when they stop: the replica Deployments).

The deployment's secrets — the RPC keys and the admin token — live in a key directory
(``--keys-dir``): made there the first time, read from it on every later render, so a
re-render carries the same Secrets and ``kubectl apply`` of it changes nothing a running pod
holds. ``--keep-secrets`` renders everything but the Secrets (a re-render where the key
directory is not at hand: the Secrets already in the cluster stay). With neither the render
refuses: fresh keys for an existing deployment would cut every replica off its frontend.
The output (with ``--keys-dir``) holds secret keys: keep it out of version control, or pipe it
straight into ``kubectl apply -f -``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import sys
import tempfile
from pathlib import Path
from typing import Any

from clipper.errors import ClipperError, ConfigError
from clipper.kube.manifests import KubeSettings, frontend_objects

__all__ = [
    "add_render_command",
    "read_admin_token",
    "read_keys",
    "render_command",
    "render_documents",
]

KEY_FILES = ("server.key", "server.key_secret", "client.key", "client.key_secret")
ADMIN_TOKEN_FILE = "admin.token"


def read_keys(directory: Path | None) -> dict[str, str]:
    """The deployment's key files: from ``directory`` (made there if missing), or fresh."""
    # Imported here: every `clipper` command builds this parser, few render (zmq: 35 ms).
    from clipper.rpc.auth import ensure_keys

    if directory is not None:
        ensure_keys(directory)
        return {f: (directory / f).read_text() for f in KEY_FILES}
    with tempfile.TemporaryDirectory(prefix="clipper-keys-") as tmp:
        ensure_keys(Path(tmp))
        return {f: (Path(tmp) / f).read_text() for f in KEY_FILES}


def read_admin_token(directory: Path) -> str:
    """The deployment's admin token: ``directory/admin.token``, made once (owner-only) and
    read from then on, like the keys beside it."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / ADMIN_TOKEN_FILE
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    token = path.read_text().strip()
    if len(token) < 16:
        raise ConfigError(f"{path}: the admin token must be at least 16 characters")
    return token


def render_documents(
    settings: KubeSettings, keys: dict[str, str] | None, admin_token: str | None = None
) -> str:
    """The objects as one multi-document YAML stream, in apply order."""
    import yaml  # as above: only for a render

    docs: list[dict[str, Any]] = frontend_objects(settings, keys, admin_token)
    text: str = yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False)
    return text


def add_render_command(sub: Any) -> None:
    k8s = sub.add_parser("k8s", help="Kubernetes manifests").add_subparsers(
        dest="action", required=True
    )
    r = k8s.add_parser(
        "render",
        help="write the manifests of a deployment (frontends, services, RBAC, keys, config)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    d = KubeSettings()
    r.add_argument("--namespace", default=d.namespace, help="namespace of every object")
    r.add_argument(
        "--image", default=d.image, help="image with clipper-serve and the models' frameworks"
    )
    r.add_argument("--frontends", type=int, default=d.frontends, help="frontend pods (StatefulSet)")
    r.add_argument(
        "--store", default=None, help="shared config store (redis://...); needed for >1 frontend"
    )
    r.add_argument("--replica-cpu", default=d.replica_cpu, help="CPU of each replica pod")
    r.add_argument("--replica-memory", default=d.replica_memory, help="memory of each replica pod")
    r.add_argument(
        "--replica-gpus", type=int, default=d.replica_gpus, help="GPUs of each replica pod"
    )
    r.add_argument("--frontend-cpu", default=d.frontend_cpu, help="CPU request of each frontend")
    r.add_argument(
        "--frontend-memory",
        default=d.frontend_memory,
        help="memory request and limit of each frontend",
    )
    r.add_argument(
        "--frontend-cpu-limit",
        default=None,
        help="CPU limit of each frontend (default none: Burstable; = --frontend-cpu: Guaranteed)",
    )
    r.add_argument(
        "--run-as-user", type=int, default=d.run_as_user, help="uid (and gid) of every pod"
    )
    r.add_argument(
        "--admin-namespace",
        default=None,
        help="namespace whose pods labelled clipper-serve/admin-client=true may reach the "
        "admin port (default: --namespace)",
    )
    r.add_argument("--state-size", default=d.state_size, help="each frontend's state volume")
    secrets_from = r.add_mutually_exclusive_group()
    secrets_from.add_argument(
        "--keys-dir",
        type=Path,
        default=None,
        help="the deployment's RPC keys and admin token: made here the first time, reused "
        "after (keep this directory)",
    )
    secrets_from.add_argument(
        "--keep-secrets",
        action="store_true",
        help="render no Secrets: the ones already in the cluster stay",
    )
    r.add_argument(
        "--artifacts-storage-class",
        default=None,
        help="a ReadWriteMany storage class (NFS, CephFS, EFS, Azure Files...) for the volume "
        "every frontend keeps the artifacts on; needed for more than one frontend",
    )
    r.add_argument(
        "--artifacts-size", default=d.artifacts_size, help="size of the shared artifacts volume"
    )
    r.add_argument("-o", "--out", default="-", help="file to write ('-': standard output)")

    # A frontend that stops leaves its replica Deployments for the next (they are adopted):
    # taking a deployment down removes them with this, after the frontends.
    rm = k8s.add_parser(
        "delete-replicas",
        help="delete every replica Deployment (and its PodDisruptionBudget) of the deployment",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    rm.add_argument("--namespace", default=d.namespace, help="the deployment's namespace")
    where = rm.add_mutually_exclusive_group()
    where.add_argument(
        "--api", default=None, help="API server URL without credentials (kubectl proxy)"
    )
    where.add_argument("--context", default=None, help="kubeconfig context (default: current)")


def render_command(args: argparse.Namespace) -> int:
    try:
        settings = KubeSettings(
            namespace=args.namespace,
            image=args.image,
            frontends=args.frontends,
            store=args.store,
            replica_cpu=args.replica_cpu,
            replica_memory=args.replica_memory,
            replica_gpus=args.replica_gpus,
            state_size=args.state_size,
            frontend_cpu=args.frontend_cpu,
            frontend_memory=args.frontend_memory,
            frontend_cpu_limit=args.frontend_cpu_limit,
            run_as_user=args.run_as_user,
            admin_namespace=args.admin_namespace,
            artifacts_storage_class=args.artifacts_storage_class,
            artifacts_size=args.artifacts_size,
        )
        if args.keep_secrets:
            text = render_documents(settings, None, None)
        elif args.keys_dir is not None:
            keys = read_keys(args.keys_dir)
            text = render_documents(settings, keys, read_admin_token(args.keys_dir))
        else:
            raise ConfigError(
                "say where the deployment's secrets come from: --keys-dir DIR (made there the "
                "first time, the same keys on every later render) or --keep-secrets (no "
                "Secrets rendered: the cluster's stay); fresh keys on each render would cut "
                "running replicas off their frontends"
            )
    except ClipperError as e:
        print(f"clipper k8s render: {e}", file=sys.stderr)
        return 2
    if args.out == "-":
        sys.stdout.write(text)
    else:
        out = Path(args.out)
        out.write_text(text)
        out.chmod(0o600)  # it holds the deployment's secret keys
        print(f"wrote {out} ({text.count('kind:')} objects); apply: kubectl apply -f {out}")
    return 0
