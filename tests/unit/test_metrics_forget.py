"""Metric series of deleted versions, replicas and applications are removed, so /metrics
stays bounded over any number of deploy/delete cycles."""

from __future__ import annotations

from clipper.metrics import Metrics


def _observe(m: Metrics, model: str, version: str, replicas: int) -> None:
    m.batch_size.labels(model=model, version=version).observe(4)
    m.queue_depth.labels(model=model, version=version).set(1)
    m.replicas.labels(model=model, version=version).set(replicas)
    m.cache_hits.labels(model=model, version=version).inc()
    m.cache_misses.labels(model=model, version=version).inc()
    m.model_errors.labels(model=model, version=version).inc()
    for r in range(replicas):
        m.replica_latency.labels(model=model, version=version, replica=str(r)).observe(0.01)
    for counter in (
        m.split_requests,
        m.split_fallbacks,
        m.shadow_requests,
        m.shadow_agreements,
        m.shadow_disagreements,
        m.shadow_dropped,
    ):
        counter.labels(model=model, version=version).inc()
    m.shadow_errors.labels(model=model, version=version, reason="deadline").inc()
    for role in ("real", "shadow"):
        m.shadow_latency.labels(model=model, version=version, role=role).observe(0.002)


def test_deploy_delete_cycles_leave_metrics_bounded() -> None:
    m = Metrics()
    _observe(m, "keep", "1", 2)
    baseline = len(m.render())
    for i in range(70):
        _observe(m, "m", str(i), 3)
        m.requests.labels(app=f"a{i}").inc()
        m.latency.labels(app=f"a{i}").observe(0.001)
        m.defaults.labels(app=f"a{i}", reason="slo").inc()
        m.missing.labels(app=f"a{i}", model="m").inc()
        m.forget_replica("m", str(i), "2")
        assert f'replica="2",version="{i}"' not in m.render().decode()
        m.forget_version("m", str(i))
        m.forget_app(f"a{i}")
    text = m.render().decode()
    assert 'model="m"' not in text and 'app="a' not in text
    assert len(m.render()) == baseline  # the surviving version's series are untouched
    assert 'model="keep"' in text
    m.forget_version("never", "seen")  # nothing to remove: no error


def test_a_version_registered_again_gets_fresh_series() -> None:
    m = Metrics()
    _observe(m, "m", "1", 1)
    m.forget_version("m", "1")
    m.cache_hits.labels(model="m", version="1").inc()
    assert 'clipper_cache_hits_total{model="m",version="1"} 1.0' in m.render().decode()
