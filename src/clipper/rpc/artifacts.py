"""Model artifacts by reference: a container on another host fetches its model from the frontend.

A container started with ``--fetch-artifact`` (the Ray manager starts them so) asks the frontend
for its version's artifact over the RPC connection it will serve on (:mod:`clipper.rpc.wire`:
artifact request / artifact chunk). That connection is CURVE-authenticated when RPC
authentication is on, so only containers holding this deployment's keys get a model; no other
port or credential is involved. The container asks for chunks one at a time (the flow control),
checks the whole against the sha256 the frontend announced, and keeps it on its own disk under
that checksum, so a restarted container (or another on the same host) fetches nothing again.

An artifact that is one file is sent as it is; a directory (what :mod:`clipper.deployers`
writes) is packed once into a tar (sorted entries, no owners or times, so the same directory
always has the same checksum) in ``<state dir>/artifact-packs``. Packing, hashing and reading
run in threads; the event loop only sends the chunks.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from clipper.rpc import wire
from clipper.rpc.server import SendTo

__all__ = ["ArtifactServer", "PackedArtifact", "pack_artifact"]

log = logging.getLogger("clipper.rpc")

# Requests served at once; more are answered "busy" and the container asks again.
_MAX_SERVING = 32
_HASH_CHUNK = 2**20


@dataclass(frozen=True, slots=True)
class PackedArtifact:
    """What is sent for one version: ``path`` (the file, or the tar of a directory)."""

    path: Path
    sha256: str
    size: int
    kind: str  # "file" or "tar"

    def meta(self, offset: int) -> dict[str, object]:
        return {"sha256": self.sha256, "size": self.size, "kind": self.kind, "offset": offset}


def _reset_tar_info(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def pack_artifact(source: Path, pack_dir: Path, stem: str) -> PackedArtifact:
    """The artifact at ``source`` as one file with its checksum (blocks: run in a thread)."""
    if source.is_dir():
        pack_dir.mkdir(parents=True, exist_ok=True)
        target = pack_dir / f"{stem}.tar"
        partial = target.with_suffix(".tar.partial")
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(source.rglob("*")):
                if path.is_symlink() or not (path.is_file() or path.is_dir()):
                    continue
                arcname = path.relative_to(source).as_posix()
                tar.add(path, arcname, recursive=False, filter=_reset_tar_info)
        partial.replace(target)
        path, kind = target, "tar"
    else:
        path, kind = source, "file"
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return PackedArtifact(path, digest.hexdigest(), size, kind)


def _error(send: SendTo, identity: bytes, message: str) -> None:
    send(identity, wire.encode_artifact_chunk({"error": message}, b""))


def _read(path: Path, offset: int, count: int) -> bytes:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read(count)


class ArtifactServer:
    """Answers artifact requests (the RPC server's ``artifacts`` handler); owns the tasks that
    pack and read, and :meth:`stop` ends them."""

    def __init__(
        self,
        *,
        artifact_of: Callable[[str, str], str | None],
        pack_dir: Path,
        on_fetch: Callable[[str, str], None] | None = None,
    ) -> None:
        """``artifact_of(name, version)``: the artifact's path on this machine, None when the
        version is unknown or has none. ``on_fetch``: counts a fetch (its first chunk)."""
        self._artifact_of = artifact_of
        self.pack_dir = pack_dir
        self._on_fetch = on_fetch
        self._packs: dict[tuple[str, str, str], asyncio.Task[PackedArtifact]] = {}
        self._serving: set[asyncio.Task[None]] = set()
        self._stopped = False

    async def start(self) -> None:
        """Remove the packs of a previous run (the artifacts they came from may be gone)."""
        await asyncio.to_thread(shutil.rmtree, self.pack_dir, True)

    async def stop(self) -> None:
        self._stopped = True
        tasks = [*self._serving, *self._packs.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._serving.clear()
        self._packs.clear()

    def __call__(self, identity: bytes, req: wire.ArtifactRequest, send: SendTo) -> None:
        """One request, from the RPC server's reader (on the loop): answered by a task, through
        ``send`` (frames to that connection)."""
        if self._stopped:
            return
        if len(self._serving) >= _MAX_SERVING:
            _error(send, identity, "the frontend is serving many artifacts; ask again later")
            return
        task = asyncio.create_task(self._serve(identity, req, send), name="clipper-artifact")
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)

    def forget(self, name: str, version: str) -> None:
        """A deleted version: its pack is no longer needed."""
        for key in [k for k in self._packs if k[:2] == (name, version)]:
            task = self._packs.pop(key)
            if task.done() and not task.cancelled() and task.exception() is None:
                packed = task.result()
                if packed.kind == "tar":
                    packed.path.unlink(missing_ok=True)

    async def _serve(self, identity: bytes, req: wire.ArtifactRequest, send: SendTo) -> None:
        source = self._artifact_of(req.name, req.version)
        if source is None:
            _error(send, identity, f"model {req.name}:{req.version} has no artifact here")
            return
        try:
            packed = await self._packed(req.name, req.version, source)
            if req.offset > packed.size:
                _error(send, identity, f"offset {req.offset} is past the end ({packed.size} bytes)")
                return
            data = b""
            if req.max_bytes:
                data = await asyncio.to_thread(_read, packed.path, req.offset, req.max_bytes)
        except OSError as e:
            log.warning("artifact of %s:%s cannot be read: %s", req.name, req.version, e)
            _error(send, identity, f"the artifact of {req.name}:{req.version} cannot be read: {e}")
            return
        if req.offset == 0 and data and self._on_fetch is not None:
            self._on_fetch(req.name, req.version)
        send(identity, wire.encode_artifact_chunk(packed.meta(req.offset), data))

    async def _packed(self, name: str, version: str, source: str) -> PackedArtifact:
        key = (name, version, source)
        task = self._packs.get(key)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            stem = hashlib.sha256(f"{name}\0{version}\0{source}".encode()).hexdigest()[:24]
            task = asyncio.create_task(
                asyncio.to_thread(pack_artifact, Path(source), self.pack_dir, stem),
                name="clipper-artifact-pack",
            )
            self._packs[key] = task
        return await asyncio.shield(task)
