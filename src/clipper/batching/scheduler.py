"""Per model version: its queue, its replicas, and the loop-free dispatch that joins them.

Nothing here owns a task. ``pump()`` runs when work arrives, when a replica frees a slot, or when
the one timer it may arm (delayed batching, expiry; on the injected clock) fires; each replica
asks its own controller how big a batch may be, and the pure :func:`decide` says whether to send
now or wait.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from clipper.batching.cold import ColdStart
from clipper.batching.controllers import BatchController, make_controller
from clipper.batching.decision import Wait, decide
from clipper.batching.health import ModelHealth, Totals
from clipper.batching.model_errors import ModelErrorLog
from clipper.batching.queue import STANDARD, ModelQueue, Task
from clipper.batching.traces import BatchTrace, begin_batch
from clipper.batching.wait import WaitPolicy, make_wait_policy
from clipper.cache import PredictionCache, abandoned
from clipper.clock import Clock, TimerHandle
from clipper.errors import (
    ClientGone,
    DeadlineExceeded,
    ModelError,
    ModelOutputError,
    OverloadedError,
)
from clipper.inputs import InputType
from clipper.metrics import Metrics
from clipper.registry import ModelVersion
from clipper.rpc.link import Connection
from clipper.rpc.outputs import OutputRefused
from clipper.tracing import hooks as _trace

__all__ = ["ModelScheduler", "Replica", "Transport"]

log = logging.getLogger("clipper.scheduler")


class Replica:
    """One connected container process serving one model version: the scheduler's slot for
    the RPC connection ``link`` (its batches in flight, its batch-size controller).

    The connection's identity, framing, liveness and token are read through to ``link``."""

    __slots__ = (
        "answered_at",
        "controller",
        "drained",
        "draining",
        "free_since",
        "in_flight",
        "latency_metric",
        "link",
        "scheduler",
        "traces",
    )

    def __init__(self, link: Connection[Replica]) -> None:
        self.link = link
        link.peer = self
        # message id -> (its tasks, when it was sent, since when a replica had been free then)
        self.in_flight: dict[int, tuple[list[Task], float, float]] = {}
        # message id -> the spans of a traced batch in flight (clipper.tracing)
        self.traces: dict[int, BatchTrace] = {}
        self.scheduler: ModelScheduler | None = None
        self.controller: BatchController | None = None
        self.latency_metric: Any = None
        # Being stopped on purpose: gets no new batches, its in-flight ones still come back.
        self.draining = False
        self.drained: asyncio.Event | None = None
        # Since when it has had a free batch slot (set when it joins and when a full one
        # answers): what tells a task's wait for a busy replica from the loop's own delay.
        self.free_since = 0.0
        # When its last batch came back. A container runs its batches one after another: a
        # batch sent while another was in flight started when that one came back.
        self.answered_at = float("-inf")

    @property
    def identity(self) -> bytes:
        return self.link.identity

    @property
    def replica_id(self) -> int:
        return self.link.replica_id

    @property
    def fast(self) -> bool:
        return self.link.fast

    @property
    def last_seen(self) -> float:
        return self.link.last_seen

    @property
    def timeout(self) -> float:
        return self.link.timeout

    @property
    def address(self) -> str:
        """The replica token its container presented ("" for one started by hand)."""
        return self.link.token


class Transport(Protocol):
    """How batches reach a replica's container (the RPC server)."""

    def send_batch(
        self,
        link: Connection[Replica],
        itype: InputType,
        payloads: list[bytes],
        traceparent: str | None = None,
    ) -> int:
        """Send the batch; return its message id. ``traceparent``: a traced batch's context."""
        ...

    def collect(self) -> None:
        """Take in the answers that already arrived and wait to be read (never blocks)."""
        ...


# Admission prices queues with the batch latencies measured so far only after this many
# batches: it admits everything before (0 capacity means "not known yet").
TRUSTED_AFTER_BATCHES = 8

# Admission probes (ModelScheduler.probe): at most one a second, after a second in which
# at least this share of at least this many offered queries was shed.
PROBE_EVERY_S = 1.0
PROBE_SHED_SHARE = 0.98
PROBE_MIN_OFFERED = 100

# Per class (critical, standard, sheddable): the share of the measured capacity a query of the
# class is not priced on, kept free for the classes above it. Standard keeps none, so a
# frontend without tenants (everything standard) sheds exactly as before.
HEADROOM: tuple[float, float, float] = (0.0, 0.0, 0.25)
_PRICED = tuple(1.0 - share for share in HEADROOM)  # the capacity each class is priced on


class ModelScheduler:
    def __init__(
        self,
        mv: ModelVersion,
        *,
        slo_s: float,
        cache: PredictionCache,
        clock: Clock,
        transport: Transport,
        metrics: Metrics,
        queue_capacity: int,
        on_replicas_changed: Callable[[ModelScheduler], None] | None = None,
    ) -> None:
        self.mv = mv
        self.cache = cache
        self.clock = clock
        self.transport = transport
        self.queue = ModelQueue(queue_capacity)
        self.replicas: list[Replica] = []
        # When a replica last failed (not drained) holding batches: a query queued before then
        # that misses its deadline may have been in them (its default says replica failure,
        # even when a restarted replica is back by the deadline).
        self.lost_at = float("-inf")
        self.slo_s = slo_s
        self._timer: TimerHandle | None = None
        self._timer_at = float("inf")
        self._wait: WaitPolicy = make_wait_policy(
            mv.batching.wait, mv.batching.max_wait_micros / 1e6
        )
        self._in_flight_cap = mv.batching.in_flight
        self._capacity_rps = 0.0
        self._batch_latency = 0.0
        self._measured = 0  # batches answered: admission sheds only once it trusts them
        self._adaptive = mv.batching.controller != "fixed"
        self._hard_max = mv.batching.max_batch_size or 4096
        # A queue longer than the cap goes out whole when that still meets its deadlines
        # (:meth:`_extended`); off only to measure what it changes.
        self.extend = True
        # A burst is priced at the batch its queue forms (:meth:`submit`); off only to measure.
        self.burst_pricing = True
        self.closed = False
        labels = {"model": mv.name, "version": mv.version}
        self._metrics = metrics
        self._batch_size = metrics.batch_size.labels(**labels)
        self._errors = metrics.model_errors.labels(**labels)
        self._probes = metrics.admission_probes.labels(**labels)
        self._abandoned = metrics.abandoned_inputs.labels(**labels)
        self._error_log = ModelErrorLog(f"{mv.name}:{mv.version}", clock)
        self._replica_gauge = metrics.replicas.labels(**labels)
        metrics.queue_depth.labels(**labels).set_function(lambda: len(self.queue))
        self.on_replicas_changed = on_replicas_changed
        # Called after each answered batch while a retiring version drains.
        self.on_drained: Callable[[], None] | None = None
        # What the autoscaler samples (running totals of inputs). Demand, what the model's own
        # queue caused: ``shed`` at admission (queue full, or the work queued ahead priced past
        # the deadline), ``late`` (expired while every replica was busy, or answered late
        # because of its wait for a busy replica). Not demand, what more replicas would not
        # fix: ``stalled`` (expired while a replica was free: the loop did not get to it),
        # ``overran`` (answered late even without any wait for a busy replica: the round trip
        # itself), ``lag_shed`` (shed before admission because the frontend was behind; the
        # query runner counts them, and counts them in ``offered`` too: they are load). And
        # ``abandoned``: inputs dropped at dispatch because every query waiting for them was
        # abandoned (their clients left).
        self.offered = 0
        self.shed = 0
        self.late = 0
        self.stalled = 0
        self.overran = 0
        self.lag_shed = 0
        self.abandoned = 0
        # Inputs the model answered, and those answered with an error (for :attr:`health`).
        self.answered_inputs = 0
        self.error_inputs = 0
        self.health = ModelHealth(clock, self._health_totals)
        # Probing (see _probe): admission lets everything in until _probe_until.
        self.probes = 0
        self._probe_until = float("-inf")
        self._window_at = clock.now()
        self._window_offered = 0
        self._window_shed = 0
        # Set (by the autoscaler) while the version may scale to zero: queries that find no
        # replica are held for one (clipper.batching.cold) instead of answered at once.
        self.cold: ColdStart | None = None

    def _health_totals(self) -> Totals:
        missed = self.shed + self.late + self.stalled + self.overran + self.lag_shed
        return (self.offered, self.answered_inputs, self.error_inputs, missed)

    # replicas
    def _new_controller(self) -> BatchController:
        b = self.mv.batching
        target = self.slo_s * b.target_fraction
        params = dict(b.params)
        if b.controller == "fixed":
            params["size"] = b.max_batch_size
        elif b.max_batch_size is not None:
            params["max_size"] = b.max_batch_size
        return make_controller(b.controller, target_s=target, **params)

    def add_replica(self, replica: Replica) -> None:
        replica.scheduler = self
        replica.controller = self._new_controller()
        replica.free_since = self.clock.now()
        replica.latency_metric = self._metrics.replica_latency.labels(
            model=self.mv.name, version=self.mv.version, replica=str(replica.replica_id)
        )
        self.replicas.append(replica)
        if self.cold is not None:
            self.cold.connected()
        self._replica_gauge.set(len(self.replicas))
        if self.on_replicas_changed is not None:
            self.on_replicas_changed(self)
        self.pump()

    def remove_replica(self, replica: Replica) -> None:
        """The replica is gone: its batches in flight go back to the queue (their queries still
        have their deadlines), and another replica may take them."""
        if replica not in self.replicas:
            return
        self.replicas.remove(replica)
        replica.scheduler = None
        if not replica.draining:
            # Removed as failed (silent, exited, unreachable): none of its answers is served
            # again. A replica stopped on purpose was drained, and its answers stand.
            self.cache.forget_producer(replica)
            if replica.in_flight:
                self.lost_at = self.clock.now()
        self._replica_gauge.set(len(self.replicas))
        self._metrics.forget_replica(self.mv.name, self.mv.version, str(replica.replica_id))
        for tasks, _, _ in replica.in_flight.values():
            self.queue.requeue(tasks)
        replica.in_flight.clear()
        self._end_traces(replica, "the replica was removed before it answered")
        self._update_capacity()
        if self.on_replicas_changed is not None:
            self.on_replicas_changed(self)
        self.pump()

    def reconfigure(self, mv: ModelVersion) -> None:
        """New settings for this version (batching, labels): the next batches use them, and
        each replica's controller starts again from the new settings."""
        self.mv = mv
        self._wait = make_wait_policy(mv.batching.wait, mv.batching.max_wait_micros / 1e6)
        self._in_flight_cap = mv.batching.in_flight
        self._adaptive = mv.batching.controller != "fixed"
        self._hard_max = mv.batching.max_batch_size or 4096
        for r in self.replicas:
            r.controller = self._new_controller()
        self.pump()

    def set_slo(self, slo_s: float) -> None:
        if slo_s != self.slo_s:
            self.slo_s = slo_s
            for r in self.replicas:
                r.controller = self._new_controller()

    # admission
    def submit(self, task: Task) -> None:
        """Queue one input; the caller pumps once after queueing a request's inputs.
        Raises :class:`OverloadedError` when the query could not meet its deadline."""
        q = self.queue
        self.offered += 1
        if self._capacity_rps > 0.0:
            # The batches queued ahead and its own, plus, when every replica is busy, what is
            # left of the batches running now. An empty queue with a free replica always
            # admits: that is also how a model whose estimate went stale (a slow first batch)
            # gets measured again instead of shedding forever. (The replica scan runs only
            # when the cheap estimate is already late: this is the query path.)
            # A shared replica also runs the batches other frontends queued on it first.
            # A task waits only behind the work of its class and above (the queue serves the
            # highest class first); a sheddable one is priced on the capacity left after the
            # headroom kept for the classes above it, so that they find replicas free.
            elsewhere = self._queued_elsewhere_s()
            rank = task.rank
            late, wait = self._priced(task, self._capacity_rps, elsewhere)
            if late and self._adaptive and q and self.burst_pricing:
                # The capacity is measured at batch boundaries, at the queue of that moment: a
                # burst onto a short queue (32 clients at once after an idle spell, or after a
                # flood shrank the cap) would be priced at the small batches of before. The
                # queue it forms goes out as one batch when its deadlines allow (_extended):
                # price it at that batch's throughput.
                grown = self._capacity_at(len(q) + 1)[0]
                if grown > self._capacity_rps:
                    late, wait = self._priced(task, grown, elsewhere)
            if late and not q.ahead(rank) and not elsewhere and self._free_replica() is not None:
                late = False
            if late and not self.probe(task.enqueued_at):
                self.shed += 1
                raise OverloadedError(
                    f"model {self.mv.name}:{self.mv.version} has {len(q)} queries queued, "
                    f"about {wait * 1e3:.1f} ms of work, more than the query's latency SLO allows"
                )
        if not q.push(task):
            evicted = q.evict_below(task.rank)
            if evicted is None:
                self.shed += 1
                raise OverloadedError(
                    f"model {self.mv.name}:{self.mv.version} queue is full ({q.capacity} queries)"
                )
            # A full queue makes room for a higher class: the lower one is shed instead.
            self.shed += 1
            q.push(task)
            self._deliver(
                evicted,
                None,
                OverloadedError(
                    f"model {self.mv.name}:{self.mv.version} queue is full ({q.capacity} "
                    "queries): a query of a higher class took this one's place"
                ),
            )
        self._wait.arrived(task.enqueued_at)

    def _priced(self, task: Task, capacity: float, elsewhere: float) -> tuple[bool, float]:
        """Whether ``task`` would miss its deadline behind the work queued ahead of it at
        ``capacity`` inputs/s, and that wait (with what is left of the batches running, when
        that decides it)."""
        wait = (self.queue.ahead(task.rank) + 1) / (capacity * _PRICED[task.rank]) + elsewhere
        late = task.enqueued_at + wait > task.deadline
        if not late and task.enqueued_at + wait + self._batch_latency > task.deadline:
            running = self._running_remaining(task.enqueued_at)
            late = task.enqueued_at + wait + running > task.deadline
            wait += running
        return late, wait

    def probe(self, now: float) -> bool:
        """True to admit a query priced late (by the queue, or shed for the frontend's own lag
        by ``SingleRunner._behind``): while a probe runs, or when one starts now.

        Admission prices queries with batch latencies measured on the frontend's own loop.
        When that loop saturates (a closed loop of hundreds of clients, and the CPU shared
        with the replicas), instant shed answers bring every client straight back, the loop
        never idles, the replica waits for CPU, every batch looks slow, and admission sheds
        everything: a state that sustains itself, with no batch ever showing it is over.
        So when a second passes with at least 98% of the queries offered shed, admission
        lets every query in for one SLO: they queue, their clients wait for answers instead
        of coming straight back, and the batches measure the model again. If it really is
        that slow, the cost is one SLO of late answers a second."""
        if now < self._probe_until:
            return True
        if now - self._window_at < PROBE_EVERY_S:
            return False
        # Shed by the queue's price or by the frontend's lag (SingleRunner._behind): either
        # spiral shows as (nearly) everything shed.
        shed_now = self.shed + self.lag_shed
        offered = self.offered - self._window_offered
        shed = shed_now - self._window_shed
        self._window_at, self._window_offered, self._window_shed = now, self.offered, shed_now
        if offered >= PROBE_MIN_OFFERED and shed >= PROBE_SHED_SHARE * offered:
            self.probes += 1
            self._probes.inc()
            log.info(
                "model %s:%s shed %d of %d queries in the last second: admitting every query "
                "for one SLO to measure it again", self.mv.name, self.mv.version, shed, offered,
            )  # fmt: skip
            self._probe_until = now + self.slo_s
            return True
        return False

    @property
    def batch_latency_s(self) -> float:
        """The typical latency of a batch of the size replicas take now (0.0: not known)."""
        return self._batch_latency

    def expected_latency_s(self, rank: int = STANDARD) -> float:
        """About how long an input queued now would take, as :meth:`submit` prices it: the
        work queued ahead of it and its own at the replicas' throughput, and what is left of
        the batches running when no replica is free. 0.0 when not known yet, or when the queue
        is empty and a replica is free: an idle model always admits, as :meth:`submit` does
        (that is also how a stale estimate gets measured again). Pipelines price their
        critical path with it. ``rank``: the class of the input, which waits only behind its
        class and those above (see :meth:`submit`)."""
        if self._capacity_rps <= 0.0:
            return 0.0
        elsewhere = self._queued_elsewhere_s()
        free = self._free_replica()
        if not elsewhere and not self.queue and free is not None and not free.in_flight:
            return 0.0
        running = self._running_remaining(self.clock.now())
        ahead = self.queue.ahead(rank) + 1
        capacity = self._capacity_rps
        if self._adaptive and self.queue and self.burst_pricing:  # as submit prices a burst
            capacity = max(capacity, self._capacity_at(len(self.queue) + 1)[0])
        return ahead / (capacity * _PRICED[rank]) + running + elsewhere

    def _queued_elsewhere_s(self) -> float:
        """How long the batches other frontends have queued on shared replicas delay ours:
        for the replica that frees first, the batches it last reported queued by others times
        the batch latency measured here (0.0 when some replica has none)."""
        best = float("inf")
        for r in self.replicas:
            if r.draining:
                continue
            n = r.link.queued_elsewhere
            if n == 0:
                return 0.0
            c = r.controller
            assert c is not None
            best = min(best, n * c.typical_latency(c.max_batch_size()))
        return 0.0 if best == float("inf") else best

    def _running_remaining(self, now: float) -> float:
        """How long until a batch sent now would start on the replica that gets to it first:
        a container runs its batches one after another, so the rest of the one it is running
        and all of those in flight behind it, priced at their real sizes (0.0 when a replica
        has nothing in flight)."""
        best = float("inf")
        for r in self.replicas:
            if r.draining:
                continue
            if not r.in_flight:
                return 0.0
            c = r.controller
            assert c is not None
            ahead = 0.0
            first = True
            for tasks, sent_at, _ in r.in_flight.values():  # in the order they were sent
                typical = c.typical_latency(len(tasks))
                if first:  # running since it was sent, or since the one before came back
                    typical = max(typical - (now - max(sent_at, r.answered_at)), 0.0)
                    first = False
                ahead += typical
            best = min(best, ahead)
        if best == float("inf"):  # every replica draining: priced as before, by the earliest
            for r in self.replicas:
                c = r.controller
                assert c is not None
                for tasks, sent_at, _ in r.in_flight.values():
                    best = min(best, max(c.typical_latency(len(tasks)) - (now - sent_at), 0.0))
        return 0.0 if best == float("inf") else best

    def _update_capacity(self) -> None:
        """Inputs per second all replicas can take: the basis of shedding at admission
        (0 = not known yet, admit). An adaptive controller grows its batches while they come
        back full, so a longer queue is priced at the batch size it will grow to, not at
        today's cap; that keeps the ramp-up after a start or a burst from shedding."""
        if self._measured < TRUSTED_AFTER_BATCHES:
            # A handful of batches, the first of them cold, extrapolated to a burst's queue
            # priced 300 queries at 15 s and shed a fresh model's first burst under a 10 s SLO.
            self._capacity_rps = 0.0
            return
        self._capacity_rps, self._batch_latency = self._capacity_at(len(self.queue))

    def _capacity_at(self, queued: int) -> tuple[float, float]:
        """Inputs per second all replicas take with ``queued`` inputs waiting, and the latency
        of the shortest of their batches: (0.0, 0.0) while some replica's is not known."""
        total = 0.0
        batch_latency = float("inf")
        for r in self.replicas:
            c = r.controller
            assert c is not None
            n = c.max_batch_size()
            if self._adaptive and queued > n:
                n = min(queued, self._hard_max)
            lat = c.typical_latency(n)
            if lat <= 0.0:
                return 0.0, 0.0
            # a container runs its batches one after another, in flight or not
            total += n / lat
            batch_latency = min(batch_latency, lat)
        return total, (batch_latency if total else 0.0)

    # dispatch
    def _free_replica(self) -> Replica | None:
        best: Replica | None = None
        cap = self._in_flight_cap
        for r in self.replicas:
            k = len(r.in_flight)
            if k < cap and not r.draining and (best is None or k < len(best.in_flight)):
                best = r
                if k == 0:
                    break
        return best

    def _idle_since(self) -> float:
        """Since when some replica has had a free batch slot (inf while every one is busy)."""
        since = float("inf")
        cap = self._in_flight_cap
        for r in self.replicas:
            if len(r.in_flight) < cap and not r.draining and r.free_since < since:
                since = r.free_since
        return since

    def pump(self) -> None:
        if self.closed:
            return
        q = self.queue
        if not q:
            return
        now = self.clock.now()
        if q.earliest_deadline() <= now:
            expired = q.drop_expired(now)
            # A replica free since before the deadline would have taken it had the loop run
            # (a replica answering pumps at once, and a batching wait ends before the deadline):
            # the frontend was behind, not the model.
            idle = self._idle_since()
            stalled = sum(1 for t in expired if idle < t.deadline)
            self.stalled += stalled
            self.late += len(expired) - stalled
            for task in expired:
                self._deliver(
                    task,
                    None,
                    DeadlineExceeded("the query's deadline passed before a replica was free"),
                )
        while q:
            r = self._free_replica()
            if r is None:
                break
            c = r.controller
            assert c is not None
            cap = c.max_batch_size()
            pending = len(q)
            d = decide(
                pending=pending,
                oldest_enqueued_at=q.oldest_enqueued_at(),
                earliest_deadline=q.earliest_deadline(),
                max_batch_size=cap,
                max_wait_s=self._wait.max_wait_s(now),
                expected_latency_s=c.expected_latency(min(pending, cap)),
                now=now,
            )
            if isinstance(d, Wait):
                self._wait.waiting(pending, now)
                self._arm(now, d.seconds)
                return
            count = d.count
            if self.extend and self._adaptive and pending > count:
                count = self._extended(c, count, pending, now)
            self._wait.dispatched(count)
            idle = self._idle_since()
            tasks = q.pop(count)
            cutoff = self.cache.abandoned_at
            for t in tasks:  # one float compare per input unless a query was abandoned
                if t.enqueued_at <= cutoff:
                    tasks = self._live(tasks, count, cutoff)
                    break
            if not tasks:
                continue  # all abandoned: decide again on what is left
            tracer = _trace.active
            bt = None if tracer is None else begin_batch(tracer, tasks, self.mv, r.replica_id, now)
            try:
                if bt is None:
                    msg_id = self.transport.send_batch(
                        r.link, self.mv.input_type, [t.payload for t in tasks]
                    )
                else:
                    msg_id = self.transport.send_batch(
                        r.link, self.mv.input_type, [t.payload for t in tasks], bt.traceparent
                    )
            except Exception as exc:  # a broken socket must not lose the queries
                log.exception("sending a batch to replica %s failed", r.replica_id)
                if bt is not None:
                    bt.finish(now, f"sending the batch failed: {exc}")
                q.requeue(tasks)
                self.remove_replica(r)
                del exc
                return
            r.in_flight[msg_id] = (tasks, now, idle)
            if bt is not None:
                r.traces[msg_id] = bt
            self._batch_size.observe(len(tasks))
        if q:
            # Nobody free: a response will pump again; meanwhile expire what cannot make it.
            self._arm(now, max(q.earliest_deadline() - now, 0.0))

    def lost_since(self, t: float) -> bool:
        """Whether a query queued at ``t`` that missed its deadline may have been lost with
        a replica: none is connected now, or one failed holding batches since ``t``."""
        return not self.replicas or self.lost_at >= t

    def collect_answers(self) -> None:
        """Read the replicas' answers that have arrived but not been read yet: a query whose
        deadline timer fires asks first (see :meth:`clipper.query.single._Query.on_deadline`)."""
        self.transport.collect()

    def _extended(self, c: BatchController, cap: int, pending: int, now: float) -> int:
        """The batch for a queue longer than the controller's cap: the whole queue (up to
        ``max_batch_size``) when the model's upper-side estimate for that batch still meets
        the earliest deadline queued, so every query in it still makes it; else the cap.

        The cap keeps a batch's latency near its target; the queries past it wait for this
        batch and then ride the next, paying the per-batch cost twice. Where that cost is
        mostly fixed (a replica sharing its core with other programs waits out their time
        slices whatever its batch), the larger batch answers all of them sooner: beside a busy
        loop, a cap of 16-28 under a queue of 30 sent every query's tail into a second batch
        and past its deadline. Admission already prices a long queue at the batch it grows
        to (:meth:`_update_capacity`); this makes the dispatch match it."""
        n = min(pending, self._hard_max)
        if n > cap and now + c.expected_latency(n) <= self.queue.earliest_deadline():
            return n
        return cap

    def _live(self, tasks: list[Task], want: int, cutoff: float) -> list[Task]:
        """``tasks`` without the inputs whose every waiter was abandoned (dropped here, never
        sent), topped up from the queue so that their batch slots go to live queries. Only
        inputs queued before the latest abandon (``cutoff``) can have abandoned waiters."""
        q = self.queue
        live: list[Task] = []
        while True:
            for t in tasks:
                if t.enqueued_at <= cutoff and (
                    self.cache.all_abandoned(t.key) if t.key is not None else abandoned(t.waiter)
                ):
                    self._drop_abandoned(t)
                else:
                    live.append(t)
            if len(live) >= want or not q:
                return live
            tasks = q.pop(want - len(live))

    def _drop_abandoned(self, task: Task) -> None:
        self.abandoned += 1
        self._abandoned.inc()
        # The waiters left are abandoned queries' (they ignore it); the cache's pending entry
        # goes with them, so that a later identical query computes the input afresh.
        self._deliver(task, None, ClientGone("every query waiting for this input was abandoned"))

    def _arm(self, now: float, seconds: float) -> None:
        at = now + seconds
        if self._timer is not None:
            if self._timer_at <= at:
                return
            self._timer.cancel()
        self._timer_at = at
        self._timer = self.clock.call_later(seconds, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = float("inf")
        self.pump()

    def on_response(
        self,
        replica: Replica,
        msg_id: int,
        outputs: list[object] | None,
        error: str | None,
        nbytes: int,
    ) -> None:
        entry = replica.in_flight.pop(msg_id, None)
        if entry is None:
            return  # a batch we gave up on (replica removed, then answered late)
        tasks, sent_at, idle = entry
        now = self.clock.now()
        if replica.traces:
            bt = replica.traces.pop(msg_id, None)
            if bt is not None:
                bt.finish(now, error)
        if len(replica.in_flight) + 1 >= self._in_flight_cap:
            replica.free_since = now  # it was full: free from now on
        if replica.drained is not None and not replica.in_flight:
            replica.drained.set()
        latency = now - sent_at
        # What the batch itself took: with batches in flight behind one another (in_flight
        # > 1), the round trip of the second includes its wait behind the first, and sizing
        # batches by it (AIMD, capacity) priced every batch at twice its cost: the cap fell
        # to 1-3 and nine queries in ten got defaults at 1,700/s beside a CPU hog.
        service = now - max(sent_at, replica.answered_at)
        replica.answered_at = now
        if tasks[0].deadline < now:  # a batch leaves the queue earliest deadline first
            self._count_late(tasks, now, idle)
        c = replica.controller
        assert c is not None
        c.observe(len(tasks), service)
        self._measured += 1
        replica.latency_metric.observe(latency)
        self._update_capacity()
        if error is None and outputs is not None and len(outputs) != len(tasks):
            error = f"predict returned {len(outputs)} outputs for {len(tasks)} inputs"
        self.health.step()
        self.answered_inputs += len(tasks)
        if error is not None or outputs is None:
            self._errors.inc()
            self._error_log.failed(error or "no outputs", len(tasks))
            self.error_inputs += len(tasks)
            self.health.failed(error or "no outputs")
            exc = ModelError(error or "no outputs")
            for task in tasks:
                self._deliver(task, None, exc)
        else:
            per_item = nbytes // max(len(tasks), 1)
            cache = self.cache
            refused = False
            for task, out in zip(tasks, outputs, strict=True):
                if type(out) is OutputRefused:  # NaN, not JSON, too large: that input only
                    if not refused:
                        refused = True
                        self._errors.inc()
                        self._error_log.failed(out.reason, len(tasks))
                        self.health.failed(out.reason)
                    self.error_inputs += 1
                    self._deliver(task, None, ModelOutputError(out.reason))
                elif task.key is not None:
                    cache.complete(task.key, out, per_item, replica)
                elif task.waiter is not None:
                    task.waiter(out, None)
        self.pump()
        if self.on_drained is not None:
            self.on_drained()

    def _count_late(self, tasks: list[Task], now: float, idle: float) -> None:
        """Count the batch's inputs answered after their deadline: ``late`` (demand) when
        their wait for a busy replica (from when it was queued until ``idle``, since when a
        replica had been free as the batch was sent) is what made them late, ``overran``
        when they would have been late without it."""
        for t in tasks:
            if t.deadline < now:
                if now - max(idle - t.enqueued_at, 0.0) <= t.deadline:
                    self.late += 1
                else:
                    self.overran += 1

    def _end_traces(self, replica: Replica, why: str) -> None:
        if replica.traces:
            now = self.clock.now()
            for bt in replica.traces.values():
                bt.finish(now, why)
            replica.traces.clear()

    def _deliver(self, task: Task, value: object, err: BaseException | None) -> None:
        if task.key is not None:
            if err is None:
                self.cache.complete(task.key, value, 0)
            else:
                self.cache.fail(task.key, err)
        elif task.waiter is not None:
            task.waiter(value, err)

    def close(self, reason: BaseException) -> None:
        """Stop dispatching; every queued or in-flight query is answered with ``reason``."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        tasks = self.queue.pop(len(self.queue))
        for r in self.replicas:
            for batch, _, _ in r.in_flight.values():
                tasks.extend(batch)
            r.in_flight.clear()
            self._end_traces(r, "the model version was closed before the replica answered")
            r.scheduler = None
        self.replicas.clear()
        self._replica_gauge.set(0)
        # Its series go with it (the queue-depth one also held this scheduler alive).
        self._metrics.forget_version(self.mv.name, self.mv.version)
        for task in tasks:
            self._deliver(task, None, reason)
