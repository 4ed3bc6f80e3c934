"""What a model artifact *is*, independent of how it travelled: a content digest, the path a
container actually runs, and a byte-for-byte reproducible archive of it.

``clipper apply`` decides whether a model version in a file is the one already deployed by
comparing digests, never timestamps or archive bytes (gzip and tar record times and owners, so
the same directory archives differently each time). The frontend computes the digest of the
artifact it runs; the client computes the digest of the file or directory it would upload; the
rules below make the two agree for the same content.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from pathlib import Path

from clipper.errors import ConfigError

__all__ = [
    "SOURCE_DIGEST_FILE",
    "archive",
    "content_digest",
    "file_digest",
    "is_digest",
    "served_path",
]

# Beside an upload (``<state>/uploads/<model>/<version>/``): the digest of the source the
# client packaged (a pickle or joblib file it loaded and repackaged), when it sent one.
SOURCE_DIGEST_FILE = "source.sha256"

_MANIFEST = "clipper-model.json"  # clipper.deployers.MANIFEST, without importing deployers
_SKIPPED_DIRS = frozenset({"__pycache__"})  # written by Python into a closure's modules/
_CHUNK = 1 << 20


def is_digest(text: object) -> bool:
    """A lowercase hex SHA-256."""
    return isinstance(text, str) and len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def served_path(path: Path) -> Path:
    """What a container runs when ``path`` is uploaded: an artifact directory (it holds
    ``clipper-model.json``) or a closure directory as it is, but a directory holding only a
    pickled ``model.pkl`` and no manifest runs that file (the upload route's rule)."""
    inner = path / "model.pkl"
    if path.is_dir() and not (path / _MANIFEST).exists() and inner.is_file():
        return inner
    return path


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _members(root: Path) -> list[Path]:
    """The files and links under ``root`` that make up an artifact, in a fixed order."""
    out = []
    for item in sorted(root.rglob("*")):
        rel = item.relative_to(root)
        if _SKIPPED_DIRS.intersection(rel.parts) or item.suffix == ".pyc":
            continue
        if item.is_symlink() or item.is_file():
            out.append(item)
    return out


def content_digest(path: Path) -> str:
    """SHA-256 of what runs: a file's bytes; for a directory, each file's relative path and
    digest (and each link's target) in path order. Times, owners and modes do not count, nor
    the ``__pycache__`` that Python writes into a closure's modules when it runs."""
    path = served_path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such file or directory")
    if path.is_file():
        return file_digest(path)
    h = hashlib.sha256(b"clipper-artifact-dir\0")
    for item in _members(path):
        rel = item.relative_to(path).as_posix()
        if item.is_symlink():
            h.update(f"L {rel}\0{item.readlink()}\0".encode())
        else:
            h.update(f"F {rel}\0{file_digest(item)}\0".encode())
    return h.hexdigest()


def archive(path: Path, *, max_bytes: int) -> bytes:
    """A reproducible gzipped tar of what runs at ``path`` (a file becomes ``model.pkl``):
    entries in path order with times, owners and modes fixed. Refused (:class:`ConfigError`)
    past ``max_bytes`` of content, before anything large is read."""
    path = served_path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such file or directory")
    if path.is_file():
        entries = [(path, "model.pkl")]
    else:
        entries = [(item, item.relative_to(path).as_posix()) for item in _members(path)]
    total = sum(item.lstat().st_size for item, _ in entries if not item.is_symlink())
    if total > max_bytes:
        raise ConfigError(
            f"the artifact holds {total} bytes, more than the {max_bytes} this frontend sends "
            "(its --max-upload-unpacked-bytes)"
        )
    buf = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for item, name in entries:
            info = tarfile.TarInfo(name)
            info.mtime = 0
            if item.is_symlink():
                info.type = tarfile.SYMTYPE
                info.linkname = str(item.readlink())
                tar.addfile(info)
                continue
            info.size = item.stat().st_size
            info.mode = 0o755 if item.stat().st_mode & 0o111 else 0o644
            with item.open("rb") as f:
                tar.addfile(info, f)
    return buf.getvalue()
