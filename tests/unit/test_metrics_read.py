"""The fast readers of counters and histograms (metrics.counter_values, histogram_values) give
what collect() gives: they read prometheus_client's children directly, and this test fails if
a prometheus_client release changes that layout (instead of the fallback hiding it)."""

from __future__ import annotations

from typing import Any

from clipper.metrics import Metrics, counter_values, histogram_values


class CollectOnly:
    """A metric seen only through collect(): the readers' fallback."""

    def __init__(self, metric: Any) -> None:
        self.collect = metric.collect


def _metrics() -> Metrics:
    m = Metrics()
    for app, n in (("a", 3), ("b", 7)):
        m.requests.labels(app=app).inc(n)
        for i in range(n):
            m.latency.labels(app=app).observe(0.0007 * (i + 1))
    m.latency.labels(app="c").observe(9.0)  # only in the +Inf bucket
    m.defaults.labels(app="a", reason="slo").inc(2)
    m.batch_size.labels(model="m", version="1").observe(5)
    return m


def test_counter_values_read_the_children_as_collect_reports_them() -> None:
    m = _metrics()
    assert hasattr(m.requests, "_metrics")  # the layout the fast path reads
    for metric in (m.requests, m.defaults, m.cache_hits):
        assert counter_values(metric) == counter_values(CollectOnly(metric))
    assert counter_values(m.requests) == {("a",): 3.0, ("b",): 7.0}
    assert counter_values(m.defaults) == {("a", "slo"): 2.0}


def test_histogram_values_read_the_children_as_collect_reports_them() -> None:
    m = _metrics()
    for metric in (m.latency, m.batch_size, m.replica_latency):
        assert histogram_values(metric) == histogram_values(CollectOnly(metric))
    lat = histogram_values(m.latency)
    assert set(lat) == {("a",), ("b",), ("c",)}
    a = lat[("a",)]
    assert a.count == 3.0
    assert abs(a.total - 0.0042) < 1e-9
    assert a.buckets[0] == (0.0005, 0.0)
    assert a.buckets[1] == (0.001, 1.0)
    assert a.buckets[-1] == (float("inf"), 3.0)
    assert lat[("c",)].buckets[-2][1] == 0.0 and lat[("c",)].count == 1.0


def test_a_histogram_series_that_did_not_move_is_not_read_again() -> None:
    m = _metrics()
    first = histogram_values(m.latency)
    m.latency.labels(app="b").observe(0.002)
    second = histogram_values(m.latency, first)
    assert second[("a",)] is first[("a",)]  # idle: the previous value, not read
    assert second[("b",)] is not first[("b",)]
    assert second[("b",)].count == 8.0
    assert second == histogram_values(CollectOnly(m.latency))
