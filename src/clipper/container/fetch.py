"""The container's end of artifacts by reference (:mod:`clipper.rpc.artifacts`): fetch the model
version's artifact from the frontend over the (authenticated) RPC connection, check it against
its sha256, and keep it on this host's disk under that checksum.

Layout of the cache directory (``--cache-dir``, default ``~/.cache/clipper-serve/artifacts``)::

    <sha256>/artifact      a one-file artifact (a cloudpickle)
    <sha256>/tree/         a directory artifact, unpacked

An entry appears only complete (it is renamed into place), so a container killed mid-download
leaves no entry that a later one would trust. A frontend that cannot be reached, refuses the
keys or does not answer in time is asked again with exponential backoff, and each failure is
logged saying which it was.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import threading
import time
from pathlib import Path

import zmq

from clipper.container.presence import ConnectionWatch, configure_reconnect
from clipper.errors import ClipperError, WireError
from clipper.rpc import wire
from clipper.rpc.auth import ClientKeys, apply_client_keys

__all__ = ["ArtifactUnavailable", "default_cache_dir", "fetch_artifact"]

CHUNK = 2**20
_ANSWER_S = 10.0
_BACKOFF_START_S = 0.2
_BACKOFF_MAX_S = 10.0

Log = logging.Logger | logging.LoggerAdapter[logging.Logger]


class ArtifactUnavailable(ClipperError):
    """The frontend has no artifact for this version, or the fetch was stopped."""


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "clipper-serve" / "artifacts"


class _NoAnswer(ClipperError):
    """No answer in time (handled inside the fetch loop)."""


class _Fetch:
    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], address: str,
                 keys: ClientKeys | None, log: Log, stop: threading.Event) -> None:  # fmt: skip
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        configure_reconnect(self.sock)
        if keys is not None:
            apply_client_keys(self.sock, keys)
        self.watch = ConnectionWatch(self.sock, address, authenticated=keys is not None, log=log)
        self.sock.connect(address)
        self.stop = stop
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)
        self.poller.register(self.watch.monitor, zmq.POLLIN)

    def close(self) -> None:
        self.watch.close()
        self.sock.close(linger=0)

    def ask(self, name: str, version: str, offset: int, count: int) -> wire.ArtifactChunk:
        self.sock.send_multipart(wire.encode_artifact_request(name, version, offset, count))
        deadline = time.monotonic() + _ANSWER_S
        while not self.stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                raise _NoAnswer
            events = dict(self.poller.poll(int(min(left, 0.1) * 1000)))
            if self.watch.monitor in events:
                self.watch.drain()
            if self.sock in events:
                try:
                    msg = wire.decode_frontend_message(self.sock.recv_multipart())
                except WireError:
                    continue
                if isinstance(msg, wire.ArtifactChunk):
                    if msg.error is not None:
                        raise ArtifactUnavailable(msg.error)
                    if msg.meta.get("offset") == offset:
                        return msg
        raise ArtifactUnavailable("stopped")


def _entry(cache_dir: Path, sha: str, kind: str) -> Path:
    return cache_dir / sha / ("tree" if kind == "tar" else "artifact")


def _download(
    f: _Fetch, name: str, version: str, first: wire.ArtifactChunk, *, cache_dir: Path, log: Log
) -> Path:
    sha, size, kind = str(first.meta["sha256"]), int(first.meta["size"]), str(first.meta["kind"])
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = cache_dir / f".{sha}.{os.getpid()}.partial"
    digest = hashlib.sha256()
    try:
        with partial.open("wb") as out:
            offset = 0
            while offset < size:
                chunk = f.ask(name, version, offset, CHUNK)
                if chunk.meta.get("sha256") != sha:
                    raise ArtifactUnavailable("the artifact changed while it was fetched")
                data = bytes(chunk.data)
                if not data:
                    raise WireError(f"an empty chunk at {offset} of {size} bytes")
                out.write(data)
                digest.update(data)
                offset += len(data)
        if digest.hexdigest() != sha:
            raise WireError(f"checksum mismatch: got {digest.hexdigest()}, announced {sha}")
        staging = cache_dir / f".{sha}.{os.getpid()}.dir"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        if kind == "tar":
            import tarfile  # only for a directory artifact

            try:
                with tarfile.open(partial) as tar:
                    tar.extractall(staging / "tree", filter="data")
            except tarfile.TarError as e:
                raise WireError(f"the artifact's tar cannot be unpacked: {e}") from None
        else:
            partial.replace(staging / "artifact")
        try:
            staging.replace(cache_dir / sha)
        except OSError:  # another container on this host finished first: its copy is as good
            shutil.rmtree(staging, ignore_errors=True)
    finally:
        partial.unlink(missing_ok=True)
    log.info("fetched the artifact of %s:%s (%d bytes, sha256 %s)", name, version, size, sha)
    return _entry(cache_dir, sha, kind)


def fetch_artifact(
    *,
    address: str,
    keys: ClientKeys | None,
    name: str,
    version: str,
    cache_dir: Path,
    stop: threading.Event,
    log: Log,
) -> Path:
    """The local path of ``name:version``'s artifact: from the cache when its checksum is
    there, else fetched from the frontend at ``address``. Retries until it has it or ``stop``
    is set (then :class:`ArtifactUnavailable`). A frontend that has no such artifact is asked
    again too (it may be starting, or the version being deployed)."""
    backoff = _BACKOFF_START_S
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        while not stop.is_set():
            f = _Fetch(ctx, address, keys, log, stop)
            try:
                first = f.ask(name, version, 0, 0)
                entry = _entry(cache_dir, str(first.meta["sha256"]), str(first.meta["kind"]))
                if entry.exists():
                    log.info("artifact of %s:%s found in the cache: %s", name, version, entry)
                    return entry
                return _download(f, name, version, first, cache_dir=cache_dir, log=log)
            except _NoAnswer:
                if not f.watch.troubled:
                    log.warning(
                        "no answer from the frontend at %s in %.0f s; asking again in %.1f s",
                        address, _ANSWER_S, backoff,
                    )  # fmt: skip
            except ArtifactUnavailable as e:
                if stop.is_set():
                    break
                # Not (yet) known there: a frontend still starting, a version being deployed.
                log.warning("the frontend has no artifact for %s:%s (%s); asking again in %.1f s",
                            name, version, e, backoff)  # fmt: skip
            except (WireError, KeyError, ValueError, OSError) as e:
                log.warning("fetching the artifact of %s:%s failed: %s; again in %.1f s",
                            name, version, e, backoff)  # fmt: skip
            finally:
                f.close()
            stop.wait(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX_S)
        raise ArtifactUnavailable("stopped")
    finally:
        with contextlib.suppress(zmq.ZMQError):
            ctx.term()
