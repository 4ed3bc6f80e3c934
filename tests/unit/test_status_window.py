"""``clipper status``'s numbers: rates and quantiles over the last window of a fake clock, and
each replica slot's state from its process and its connection."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from clipper.clock import FakeClock
from clipper.frontend.admin_state import StateRoutes
from clipper.metrics import Metrics, counter_values, histogram_quantile, histogram_values
from clipper.metrics_window import MetricsWindow
from clipper.registry import Registry
from tests.catalogs import catalog_of


def test_rates_cover_the_window_only() -> None:
    clock = FakeClock()
    m = Metrics()
    window = MetricsWindow(m, clock, window_s=60.0, interval_s=5.0)
    window.start()
    # An old burst, then steady traffic: the burst leaves the window.
    for _ in range(1000):
        m.requests.labels(app="a").inc()
        m.latency.labels(app="a").observe(1.0)
    clock.advance(120)
    for _ in range(120):  # 2 queries/s over the next 60 s
        m.requests.labels(app="a").inc()
        m.latency.labels(app="a").observe(0.004)
        clock.advance(0.5)
    m.defaults.labels(app="a", reason="model_error").inc(6)
    m.defaults.labels(app="a", reason="slo").inc(12)
    rates = window.app_rates()["a"]
    assert 55 <= rates["window_s"] <= 65
    assert abs(rates["qps"] - 120 / rates["window_s"]) < 0.3
    assert rates["errors_per_s"] < rates["defaults_per_s"]
    assert rates["error_fraction"] is not None and rates["error_fraction"] < 0.06
    assert set(rates["defaults_by_reason"]) == {"model_error", "slo"}
    # The 1 s burst is out of the window: the latencies are those of the last minute.
    assert rates["p99_ms"] is not None and rates["p99_ms"] <= 5.0
    assert rates["p50_ms"] is not None and 2.0 <= rates["p50_ms"] <= 5.0
    window.stop()
    assert clock.pending() == 0 and not window.running


class _OnlyCollect:
    """A metric seen only through collect(): the readers' fallback."""

    def __init__(self, metric: Any) -> None:
        self.metric = metric

    def collect(self) -> Any:
        return self.metric.collect()


def test_the_fast_readers_agree_with_collect() -> None:
    m = Metrics()
    for i in range(3):
        m.defaults.labels(app=f"a{i}", reason="slo").inc(i + 1)
        m.latency.labels(app=f"a{i}").observe(0.003 * (i + 1))
    assert counter_values(m.defaults) == counter_values(_OnlyCollect(m.defaults))
    assert counter_values(m.defaults)[("a2", "slo")] == 3
    assert histogram_values(m.latency) == histogram_values(_OnlyCollect(m.latency))
    assert histogram_values(m.latency)[("a0",)].buckets[-1] == (float("inf"), 1.0)


def test_quantiles_interpolate_inside_the_bucket() -> None:
    buckets = [(0.001, 0.0), (0.002, 50.0), (0.005, 100.0), (float("inf"), 100.0)]
    assert histogram_quantile(0.5, buckets) == 0.002
    q99 = histogram_quantile(0.99, buckets)
    assert q99 is not None and 0.002 < q99 < 0.005
    assert histogram_quantile(0.5, [(0.001, 0.0), (float("inf"), 0.0)]) is None


@dataclass
class _Proc:
    model: str
    version: str
    slot: int
    token: str
    pid: int | None
    restarts: int
    last_exit: int | None = None
    state: str = "running"
    location: str = "local"


class _Manager:
    def __init__(self, procs: list[_Proc]) -> None:
        self.procs = procs

    def all_replicas(self) -> list[_Proc]:
        return self.procs

    def log_files(self, name: str, version: str) -> dict[int, Path]:
        return {p.slot: Path(f"/logs/{name}-{version}-{p.slot}.log") for p in self.procs}


def _replica(address: str, replica_id: int, sched: Any, draining: bool = False) -> Any:
    return SimpleNamespace(
        address=address, replica_id=replica_id, draining=draining, in_flight={},
        last_seen=1000.0, scheduler=sched,
    )  # fmt: skip


def test_replica_states_and_ids_match_the_log_files() -> None:
    mv = SimpleNamespace(name="m", version="1", key=("m", "1"))
    sched = SimpleNamespace(mv=mv, replicas=[])
    sched.replicas = [
        _replica("m:1:0:9", 7, sched),  # slot 0, restarted: its scheduler id moved on to 7
        _replica("m:1:3:4", 3, sched, draining=True),
        _replica("", 11, sched),  # an external container
    ]
    procs = [
        _Proc("m", "1", 0, "m:1:0:9", 100, restarts=2),
        _Proc("m", "1", 1, "m:1:1:5", 101, restarts=0),
        _Proc("m", "1", 2, "m:1:2:6", None, restarts=1, last_exit=1),
        _Proc("m", "1", 3, "m:1:3:4", 103, restarts=0),
        _Proc("m", "1", 4, "m:1:4:8", None, restarts=5, last_exit=1),
        _Proc("m", "1", 5, "m:1:5:2", None, restarts=0, state="queued"),  # its turn to come
        _Proc("m", "1", 6, "m:1:6:3", None, restarts=1, state="queued"),  # a restart, likewise
    ]
    routes = StateRoutes(
        registry=Registry(), catalog=catalog_of(Registry(), {("m", "1"): sched}),
        manager=cast(Any, _Manager(procs)), window=cast(Any, None), clock=FakeClock(),
        state_dir=Path("/nonexistent"), max_artifact_bytes=1,
    )  # fmt: skip
    states = routes._replica_states()
    got = [(s["replica"], s["state"], s["log"]) for s in states]
    assert got == [
        (0, "ready", "m-1-0.log"),
        (1, "starting", "m-1-1.log"),
        (2, "restarting", "m-1-2.log"),
        (3, "draining", "m-1-3.log"),
        (4, "failed", "m-1-4.log"),
        (5, "queued", "m-1-5.log"),
        (6, "queued", "m-1-6.log"),
        (11, "ready", None),
    ]
    assert states[0]["restarts"] == 2 and states[0]["connected"] is True
    assert states[7]["location"] == "external"
