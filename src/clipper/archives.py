"""Unpacking an uploaded model archive (a gzipped tar) safely: bounded in size and file count,
and never writing outside its destination. The admin API unpacks uploads with it, and
``clipper export`` the artifacts it downloads."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

from clipper.errors import ClipperError

__all__ = [
    "DEFAULT_MAX_UPLOAD_FILES",
    "DEFAULT_MAX_UPLOAD_UNPACKED_BYTES",
    "ArchiveTooLarge",
    "extract_archive",
]


class ArchiveTooLarge(ClipperError):
    """An uploaded archive over the unpacked-size or file-count limit (a decompression bomb
    or a mistake): refused before it fills the disk."""


# Generous for a model directory, far below what a small archive can claim to unpack to.
DEFAULT_MAX_UPLOAD_UNPACKED_BYTES = 2 * 2**30
DEFAULT_MAX_UPLOAD_FILES = 10_000


def extract_archive(
    dest: Path,
    archive: bytes,
    *,
    max_bytes: int = DEFAULT_MAX_UPLOAD_UNPACKED_BYTES,
    max_files: int = DEFAULT_MAX_UPLOAD_FILES,
) -> None:
    """Unpack an uploaded artifact; the "data" filter refuses absolute paths, links out of
    the directory and device files, so an upload cannot write outside ``dest``.

    Read as a stream, member by member, each checked before it is written: an archive whose
    members add up to more than ``max_bytes`` or ``max_files`` stops there (raising
    :class:`ArchiveTooLarge`; the caller removes what was written), so a small upload cannot
    unpack into gigabytes, and nothing past the limit is even decompressed."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    total = files = 0
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r|gz") as tar:
        for member in tar:
            files += 1
            total += max(member.size, 0)
            if files > max_files:
                raise ArchiveTooLarge(
                    f"the archive has more than {max_files} entries "
                    "(the limit is --max-upload-files)"
                )
            if total > max_bytes:
                raise ArchiveTooLarge(
                    f"the archive unpacks to more than {max_bytes} bytes "
                    "(the limit is --max-upload-unpacked-bytes)"
                )
            tar.extract(member, dest, filter="data")
