"""The ray:// manager's calls into Ray: every one blocks, so the manager runs them on its own
thread pool (:mod:`clipper.managers.ray_engine`), never on the event loop.

:class:`RayActors` creates, configures, polls and kills the replica actors by name, lists the
names of a frontend's actors, and reads the node view the placement planner needs
(:mod:`clipper.managers.ray_spread`): ``ray.nodes()`` for which nodes are alive and what each
has in total, and Ray's per-node view of what is free (a developer API, guarded: without it the
planner sees each node's total as free).

Actor names: ``<prefix><model>/<version>/<slot>`` for a slot's first actor and
``<prefix><model>/<version>/<slot>.<generation>`` for the ones that replaced it (a replica moved
to another node, or re-placed after its node died), so a replacement can run beside the actor it
replaces; :func:`parse_slot` reads both forms.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from clipper.managers.ray_spread import NodeState

__all__ = ["DEAD", "GONE", "RayActors", "actor_name", "parse_slot"]

log = logging.getLogger("clipper.manager")

CALL_TIMEOUT_S = 10.0
DEAD = "dead"  # the actor did not answer: dead, or being restarted by Ray
GONE = "gone"  # no actor of that name any more: dead for good (its node died, it was killed)


def actor_name(stem: str, slot: int, generation: int) -> str:
    """``<stem><slot>`` for generation 0, ``<stem><slot>.<generation>`` after."""
    return f"{stem}{slot}" if generation == 0 else f"{stem}{slot}.{generation}"


def parse_slot(rest: str) -> tuple[int, int] | None:
    """``"3"`` -> (3, 0), ``"3.2"`` -> (3, 2); None for anything else."""
    slot, sep, gen = rest.partition(".")
    if not slot.isdigit() or (sep and not gen.isdigit()):
        return None
    return int(slot), int(gen) if sep else 0


class RayActors:
    """The blocking side; one per manager, used from its thread pool only."""

    def __init__(self, namespace: str, *, stop_timeout_s: float, poll_s: float) -> None:
        self.namespace = namespace
        self.stop_timeout_s = stop_timeout_s
        self.poll_s = poll_s
        self._handles: dict[str, Any] = {}
        self._actor_class: Any = None
        self._no_free_view = False

    def connect(self, address: str) -> None:
        import ray

        from clipper.managers.ray_replica import ReplicaSupervisor

        if not ray.is_initialized():
            ray.init(
                address=address,
                namespace=self.namespace,
                log_to_driver=False,
                configure_logging=False,
            )
        if self._actor_class is None:
            self._actor_class = ray.remote(ReplicaSupervisor)

    def create(
        self,
        name: str,
        spec: dict[str, Any],
        keys: dict[str, bytes] | None,
        options: dict[str, Any],
    ) -> None:
        """Start the actor ``name`` (or adopt the one running under that name)."""
        import ray

        handle = self._actor_class.options(
            name=name,
            namespace=self.namespace,
            lifetime="detached",
            get_if_exists=True,
            max_restarts=-1,
            max_task_retries=0,
            max_concurrency=4,  # a status poll is answered while stop() waits
            **options,
        ).remote(name, spec, keys)
        self._handles[name] = handle
        # Adopted (it ran before this frontend started): tell it our address. A new actor
        # already has it; this call then also waits until it is placed (bounded). One not
        # placed yet, or restarting, gets it when it runs; the status poll reports it meanwhile.
        with contextlib.suppress(ray.exceptions.GetTimeoutError, ray.exceptions.RayError):
            ray.get(handle.configure.remote(spec), timeout=CALL_TIMEOUT_S)

    def reconfigure(self, stale: list[tuple[str, dict[str, Any]]]) -> None:
        import ray

        for name, spec in stale:
            with contextlib.suppress(ValueError, ray.exceptions.RayError):
                self._handle(name).configure.remote(spec)  # not waited for

    def _handle(self, name: str) -> Any:
        import ray

        handle = self._handles.get(name)
        if handle is None:
            handle = ray.get_actor(name, namespace=self.namespace)
            self._handles[name] = handle
        return handle

    def kill(self, name: str, graceful: bool = True) -> None:
        """Stop the container (``graceful``: SIGTERM, it drains and says goodbye; not for an
        actor whose node is gone) and kill the actor for good."""
        import ray

        try:
            handle = self._handle(name)
        except ValueError:
            return  # already gone
        if graceful:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(handle.stop.remote(self.stop_timeout_s),
                        timeout=self.stop_timeout_s + CALL_TIMEOUT_S)  # fmt: skip
        with contextlib.suppress(ValueError, ray.exceptions.RayError):
            ray.kill(handle, no_restart=True)
        self._handles.pop(name, None)

    def _exists(self, name: str) -> bool:
        try:
            import ray

            ray.get_actor(name, namespace=self.namespace)
        except ValueError:
            self._handles.pop(name, None)
            return False
        return True

    def statuses(self, names: list[str]) -> list[dict[str, Any] | str | None]:
        """Per actor: its status, :data:`DEAD` (no answer: dead or being restarted),
        :data:`GONE` (no actor by that name) or None (no answer within a poll period: a busy
        node, or not placed yet; nothing is concluded from it)."""
        import ray

        refs: list[Any] = []
        for name in names:
            try:
                refs.append(self._handle(name).status.remote())
            except ValueError:
                refs.append(GONE)
            except ray.exceptions.RayError:
                refs.append(DEAD)
        pending = [ref for ref in refs if not isinstance(ref, str)]
        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=self.poll_s)
        done = set(ready)
        out: list[dict[str, Any] | str | None] = []
        for name, ref in zip(names, refs, strict=True):
            if isinstance(ref, str):
                out.append(ref)
            elif ref not in done:
                out.append(None)
            else:
                try:
                    out.append(ray.get(ref))
                except ray.exceptions.RayError:
                    out.append(DEAD if self._exists(name) else GONE)
        return out

    def names(self, prefix: str) -> list[str]:
        """The names of the namespace's actors that start with ``prefix``."""
        import ray.util

        return [str(a["name"]) for a in ray.util.list_named_actors(all_namespaces=True)
                if a.get("namespace") == self.namespace
                and str(a["name"]).startswith(prefix)]  # fmt: skip

    def versions_actors(self, stem: str) -> dict[int, list[tuple[int, str]]]:
        """A version's actors (``stem`` = ``<prefix><model>/<version>/``): slot -> [(generation,
        name)]."""
        out: dict[int, list[tuple[int, str]]] = {}
        for name in self.names(stem):
            parsed = parse_slot(name.removeprefix(stem))
            if parsed is not None:
                out.setdefault(parsed[0], []).append((parsed[1], name))
        return out

    def nodes(self) -> list[NodeState] | None:
        """Every node Ray knows, alive or not, with its total and free resources; None when
        this Ray has no node table (then Ray places the actors itself)."""
        import ray

        table = getattr(ray, "nodes", None)
        if table is None:
            return None
        free_by_node = self._free_view()
        out = []
        for node in table():
            node_id = str(node.get("NodeID", ""))
            total = {str(k): float(v) for k, v in dict(node.get("Resources") or {}).items()}
            alive = bool(node.get("Alive"))
            free = free_by_node.get(node_id, total) if free_by_node is not None else total
            out.append(NodeState(node_id, alive, total, {str(k): float(v)
                                                         for k, v in free.items()}))  # fmt: skip
        return out

    def _free_view(self) -> dict[str, dict[str, float]] | None:
        if self._no_free_view:
            return None
        try:
            from ray._private.state import available_resources_per_node
        except ImportError:
            self._no_free_view = True
            log.warning("this Ray has no per-node free-resource view: placing by totals")
            return None
        return {str(k): dict(v) for k, v in available_resources_per_node().items()}
