"""Who may connect to the RPC port: ZeroMQ CURVE keys of this deployment, checked off the loop.

The frontend's ROUTER is a CURVE server. A container proves it belongs to the deployment by
holding the deployment's client secret key (one keypair shared by its containers) and the
server's public key; everything else is refused during the handshake, before any message of it
reaches the event loop:

* a container without keys (or the original ``rpc.py``) fails on the mechanism (NULL vs CURVE),
* one with a wrong server key fails on the cryptography,
* one with a valid handshake but a client key we do not know is denied by our ZAP handler.

Keys live in one directory (default ``<state dir>/rpc-keys``), in the ZeroMQ certificate format
(``zmq.auth.load_certificate`` reads them): ``server.key`` / ``server.key_secret`` and
``client.key`` / ``client.key_secret``. Secret files are 0600 in a 0700 directory and are made on
the first start. A container needs ``server.key`` and ``client.key_secret`` (``--rpc-keys DIR``);
the manager passes the directory's path, never key text, since command lines are public.

:class:`RpcGuard` runs the ZAP handler and reads the socket monitor on one thread of its own: the
handshake needs an answer even while the event loop is busy, and refusals must not cost the loop
anything. It counts every refusal (``on_refused``, called on that thread) and logs at most one
line per :data:`LOG_INTERVAL_S`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import stat
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
import zmq.utils.z85

from clipper.errors import ConfigError

__all__ = [
    "CLIENT",
    "LOG_INTERVAL_S",
    "SERVER",
    "ClientKeys",
    "RpcGuard",
    "ServerKeys",
    "apply_client_keys",
    "ensure_keys",
    "load_client_keys",
]

log = logging.getLogger("clipper.rpc")

SERVER = "server"
CLIENT = "client"
# One log line per this many seconds at most, however many connections are refused.
LOG_INTERVAL_S = 60.0
ZAP_DOMAIN = b"clipper"
_ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by the ZAP spec, one per context
_REFUSALS = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
_guard_ids = itertools.count()


@dataclass(frozen=True, slots=True)
class ServerKeys:
    """What the frontend needs: its own keypair and the client public keys it accepts."""

    directory: Path
    public: bytes
    secret: bytes
    clients: frozenset[bytes]  # z85 public keys


@dataclass(frozen=True, slots=True)
class ClientKeys:
    """What a container needs: the server's public key and the deployment's client keypair."""

    server_public: bytes
    public: bytes
    secret: bytes


def _require_curve() -> None:
    if not zmq.has("curve"):
        raise ConfigError(
            f"the installed libzmq ({zmq.zmq_version()}) has no CURVE support, so containers "
            "cannot be authenticated: install a pyzmq wheel (it bundles libsodium) or, with "
            "the RPC port on loopback only, set --no-rpc-auth (CLIPPER_RPC_AUTH=0)"
        )


def _write_cert(path: Path, public: bytes, secret: bytes | None) -> None:
    """Write a certificate without ever leaving a half-written or world-readable file, and
    without replacing one a concurrent start wrote first (link fails if it exists)."""
    lines = [
        "#   ZeroMQ CURVE certificate of a clipper-serve deployment",
        "metadata",
        "curve",
        f'    public-key = "{public.decode("ascii")}"',
    ]
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode("ascii")}"')
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, ("\n".join(lines) + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass  # another frontend on this state dir made it first: theirs is the one
    finally:
        tmp.unlink()


def _private(st: os.stat_result) -> bool:
    """A secret key file only its owner can read — or, for a file someone else owns, only its
    group, read-only: how Kubernetes hands a Secret to a non-root pod (root-owned, group
    ``fsGroup``, mode 0440), which is then the pod's own group."""
    if st.st_mode & stat.S_IRWXO:
        return False
    if st.st_uid != os.geteuid():
        return not st.st_mode & (stat.S_IWGRP | stat.S_IXGRP)
    return not st.st_mode & stat.S_IRWXG


def _read_cert(path: Path, *, secret: bool) -> tuple[bytes, bytes | None]:
    if secret:
        st = path.stat()
        mode = st.st_mode
        if not _private(st):
            raise ConfigError(
                f"{path} holds a secret key but is readable by others "
                f"(mode {stat.S_IMODE(mode):o}): chmod 600 it"
            )
    try:
        public, sec = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read the RPC key file {path}: {e}") from None
    if secret and not sec:
        raise ConfigError(f"{path} has no secret-key")
    return public, sec


def _keypair(directory: Path, name: str) -> tuple[bytes, bytes]:
    secret_path = directory / f"{name}.key_secret"
    if not secret_path.exists():
        _write_cert(secret_path, *zmq.curve_keypair())
    public, secret = _read_cert(secret_path, secret=True)
    assert secret is not None
    if not (directory / f"{name}.key").exists():
        _write_cert(directory / f"{name}.key", public, None)
    return public, secret


def ensure_keys(directory: Path) -> ServerKeys:
    """The deployment's keys in ``directory``, made on the first start (a few ms; a start
    reads them). Raises :class:`ConfigError` when they are unreadable or readable by others."""
    _require_curve()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if stat.S_IMODE(directory.stat().st_mode) & (stat.S_IRWXG | stat.S_IRWXO):
        # Ours: keep the secrets' names private too. A read-only mount of keys made elsewhere
        # (a Kubernetes Secret) cannot be changed, and its files are checked one by one.
        with contextlib.suppress(OSError):
            os.chmod(directory, 0o700)
    public, secret = _keypair(directory, SERVER)
    if (directory / f"{CLIENT}.key").exists() and not (directory / f"{CLIENT}.key_secret").exists():
        # Only the replicas' public key was given (their secret one stays with them).
        client_public, _ = _read_cert(directory / f"{CLIENT}.key", secret=False)
    else:
        client_public, _ = _keypair(directory, CLIENT)
    return ServerKeys(directory, public, secret, frozenset({client_public}))


def load_client_keys(directory: Path) -> ClientKeys:
    """A container's keys: ``server.key`` and ``client.key_secret`` from ``directory`` (the
    frontend's key directory, or a copy of those two files on another machine)."""
    _require_curve()
    server_public, _ = _read_cert(directory / f"{SERVER}.key", secret=False)
    public, secret = _read_cert(directory / f"{CLIENT}.key_secret", secret=True)
    assert secret is not None
    return ClientKeys(server_public, public, secret)


def apply_client_keys(sock: zmq.Socket[bytes], keys: ClientKeys) -> None:
    """Make ``sock`` (before it connects) a CURVE client with ``keys``."""
    sock.curve_serverkey = keys.server_public
    sock.curve_publickey = keys.public
    sock.curve_secretkey = keys.secret


class RpcGuard:
    """The ZAP handler and refusal counter of one CURVE server socket (see the module doc).

    :meth:`arm` binds the ZAP endpoint and the socket's monitor and makes ``sock`` a CURVE
    server; call it before ``sock`` binds. :meth:`stop` after ``sock`` is closed.
    """

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        keys: ServerKeys,
        *,
        on_refused: Callable[[str], None] | None = None,
        now: Callable[[], float],
    ) -> None:
        self._ctx = ctx
        self._keys = keys
        self._allowed: Collection[bytes] = frozenset(zmq.utils.z85.decode(k) for k in keys.clients)
        self._on_refused = on_refused
        self._now = now
        self._thread: threading.Thread | None = None
        self._ctl: zmq.Socket[bytes] | None = None
        self.refused = 0  # read by tests; written only by the guard thread
        self._logged_at: float | None = None
        self._unlogged = 0

    def arm(self, sock: zmq.Socket[bytes]) -> None:
        zap = self._ctx.socket(zmq.ROUTER)
        zap.setsockopt(zmq.LINGER, 0)
        zap.bind(_ZAP_ENDPOINT)
        ctl_addr = f"inproc://clipper-rpc-guard-{next(_guard_ids)}"
        ctl_in = self._ctx.socket(zmq.PAIR)
        ctl_in.bind(ctl_addr)
        ctl = self._ctx.socket(zmq.PAIR)
        ctl.setsockopt(zmq.LINGER, 0)
        ctl.connect(ctl_addr)
        self._ctl = ctl
        sock.curve_server = True
        sock.curve_secretkey = self._keys.secret
        sock.zap_domain = ZAP_DOMAIN
        monitor = sock.get_monitor_socket(_REFUSALS)
        # The sockets move to the thread; starting it is the memory barrier ZeroMQ asks for.
        self._thread = threading.Thread(
            target=self._run, args=(zap, monitor, ctl_in), name="clipper-rpc-guard", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._ctl is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._ctl.send(b"stop")
            self._ctl.close(linger=0)
            self._ctl = None
        if self._thread is not None:
            self._thread.join(2.0)  # it wakes at once on the stop message
            self._thread = None

    # -- the guard thread -----------------------------------------------------------------------
    def _run(
        self, zap: zmq.Socket[bytes], monitor: zmq.Socket[bytes], ctl: zmq.Socket[bytes]
    ) -> None:
        # Here, not at the top: zmq.utils.monitor imports asyncio (about 35 ms), and a model
        # container, which imports this module for its client keys, never runs a guard.
        from zmq.utils.monitor import recv_monitor_message

        poller = zmq.Poller()
        for s in (zap, monitor, ctl):
            poller.register(s, zmq.POLLIN)
        try:
            while True:
                ready = dict(poller.poll())
                if ctl in ready:
                    return
                if zap in ready:
                    self._answer(zap)
                if monitor in ready:
                    event = recv_monitor_message(monitor)
                    if event["event"] & _REFUSALS:
                        unknown = event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH
                        self._refused("unknown_key" if unknown else "no_keys")
        except zmq.ContextTerminated:
            pass
        except Exception:
            log.exception("the RPC authentication thread failed; new containers cannot join")
        finally:
            for s in (zap, monitor, ctl):
                s.close(linger=0)

    def _answer(self, zap: zmq.Socket[bytes]) -> None:
        # [routing id, "", version, request id, domain, address, identity, mechanism, creds...]
        frames = zap.recv_multipart()
        if len(frames) < 8:
            return
        request_id, mechanism, creds = frames[3], frames[7], frames[8:]
        ok = mechanism == b"CURVE" and len(creds) == 1 and creds[0] in self._allowed
        status, text = (b"200", b"OK") if ok else (b"400", b"unknown client key")
        zap.send_multipart([frames[0], b"", b"1.0", request_id, status, text, b"", b""])

    def _refused(self, reason: str) -> None:
        self.refused += 1
        if self._on_refused is not None:
            try:
                self._on_refused(reason)
            except Exception:
                log.exception("counting a refused RPC connection failed")
        self._unlogged += 1
        now = self._now()
        if self._logged_at is not None and now - self._logged_at < LOG_INTERVAL_S:
            return
        log.warning(
            "refused %d RPC connection(s) without this deployment's keys (latest: %s); a "
            "container needs --rpc-keys %s (see docs/containers.md). Counted in "
            "clipper_rpc_refused_total; logged at most every %.0f s",
            self._unlogged,
            "unknown client key" if reason == "unknown_key" else "no or wrong CURVE keys",
            self._keys.directory,
            LOG_INTERVAL_S,
        )
        self._logged_at = now
        self._unlogged = 0
