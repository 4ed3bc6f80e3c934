"""Where a model's artifact is placed in the state directory before its version is deployed.

Two ways in, one layout: a Python object the embedded API packages goes to
``<state dir>/models/<name>/<version>`` (:meth:`Artifacts.package`); an upload the admin API
receives goes to ``<state dir>/uploads/<name>/<version>`` (:meth:`Artifacts.place_upload`),
with the upload's digest beside it (a retried upload is recognised) and, when the client sent
one, the digest of the source it was built from (what ``clipper apply`` compares).

Unpacking an uploaded archive is the caller's (``unpack``): its limits and its errors belong
to the protocol that received it.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clipper.artifact_digest import SOURCE_DIGEST_FILE
from clipper.deployers import package
from clipper.errors import RegistryError

__all__ = ["DIGEST_FILE", "Artifacts", "Unpack", "resolve_artifact", "upload_dir"]

DIGEST_FILE = "upload.sha256"  # beside an upload: recognises the same upload retried
_GZIP = b"\x1f\x8b"

# Unpacks a gzipped tar (the upload's body) into a directory that it creates afresh.
Unpack = Callable[[Path, bytes], None]


def resolve_artifact(path: str) -> str:
    """An artifact path given by a client, absolute; refused when nothing is there."""
    p = Path(path).expanduser()
    if not p.exists():
        raise RegistryError(
            f"artifact_path '{path}' does not exist on the frontend's machine: give a "
            "cloudpickle file or a directory artifact there, or use /admin/upload_model"
        )
    return str(p.resolve())


def upload_dir(state_dir: Path, name: str, version: str) -> Path:
    """The directory an upload of ``name:version`` is placed in (and its digests beside it)."""
    return state_dir / "uploads" / name / version


class Artifacts:
    """Artifact placement under one state directory. Blocking: call from a thread."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir

    def package(self, name: str, version: str, model: Any) -> Path:
        """The model as an artifact directory in the state directory (the framework is
        detected: scikit-learn, PyTorch, ONNX, XGBoost, LightGBM, or any Python object)."""
        dest = self.state_dir / "models" / name / version
        if dest.exists():
            shutil.rmtree(dest)  # a deploy that failed earlier left it; this version is new
        return package(model, dest)

    def upload_digest(self, name: str, version: str) -> str | None:
        """The SHA-256 of the upload placed for ``name:version``, if one is."""
        try:
            return (upload_dir(self.state_dir, name, version) / DIGEST_FILE).read_text().strip()
        except OSError:
            return None

    def place_upload(
        self,
        name: str,
        version: str,
        body: bytes,
        *,
        digest: str,
        unpack: Unpack,
        source_sha256: str | None = None,
    ) -> Path:
        """Write an upload (a gzipped tar of an artifact directory, else a cloudpickle file)
        and its digests; the artifact path to deploy. A tar holding only ``model.pkl`` (no
        ``clipper-model.json``) is that pickled model."""
        base = upload_dir(self.state_dir, name, version)
        if source_sha256 is not None:
            _write_file(base / SOURCE_DIGEST_FILE, source_sha256.encode())
        _write_file(base / DIGEST_FILE, digest.encode())
        if body[:2] == _GZIP:
            path = base / "artifact"
            unpack(path, body)
            inner = path / "model.pkl"
            if not (path / "clipper-model.json").exists() and inner.exists():
                path = inner
            return path
        path = base / "model.pkl"
        _write_file(path, body)
        return path

    def remove_upload(self, name: str, version: str) -> None:
        """An upload's ``<name>/<version>`` directory, and ``<name>`` when nothing else is
        left."""
        base = upload_dir(self.state_dir, name, version)
        shutil.rmtree(base, ignore_errors=True)
        with contextlib.suppress(OSError):  # only when empty: other versions of the model stay
            base.parent.rmdir()


def _write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(path)
