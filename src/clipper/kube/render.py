"""``clipper k8s render``: the manifests of a deployment, written once for ``kubectl apply``.

The RPC keys are made here (or read from an existing key directory, e.g. a frontend's
``<state dir>/rpc-keys``) and written into the two Secrets, so every frontend and every replica
of the deployment shares one keypair. The output holds secret keys: keep it out of version
control, or pipe it straight into ``kubectl apply -f -``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from clipper.errors import ClipperError
from clipper.kube.manifests import KubeSettings, frontend_objects
from clipper.rpc.auth import ensure_keys

__all__ = ["add_render_command", "render_command", "render_documents"]

KEY_FILES = ("server.key", "server.key_secret", "client.key", "client.key_secret")


def read_keys(directory: Path | None) -> dict[str, str]:
    """The deployment's key files: from ``directory`` (made there if missing), or fresh."""
    if directory is not None:
        ensure_keys(directory)
        return {f: (directory / f).read_text() for f in KEY_FILES}
    with tempfile.TemporaryDirectory(prefix="clipper-keys-") as tmp:
        ensure_keys(Path(tmp))
        return {f: (Path(tmp) / f).read_text() for f in KEY_FILES}


def render_documents(settings: KubeSettings, keys: dict[str, str]) -> str:
    """The objects as one multi-document YAML stream, in apply order."""
    docs: list[dict[str, Any]] = frontend_objects(settings, keys)
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
    r.add_argument("--state-size", default=d.state_size, help="each frontend's state volume")
    r.add_argument(
        "--keys-dir",
        type=Path,
        default=None,
        help="use (or make) the RPC keys in this directory instead of fresh ones",
    )
    r.add_argument("-o", "--out", default="-", help="file to write ('-': standard output)")


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
        )
        text = render_documents(settings, read_keys(args.keys_dir))
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
