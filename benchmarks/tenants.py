"""Tenants under overload: priority classes and quotas, against a real ``clipper start``.

    python benchmarks/tenants.py [--duration 20] [--slo-ms 300]

One ``clipper start`` frontend (a subprocess on free ports, local manager) serving one
application whose model is paced: 5 ms a batch and 20 ms an input, batches of at most 2, so one
replica answers about 45 inputs a second whatever the load (its capacity is measured here
first, with a closed loop). Every query's input is distinct (the prediction cache is off), and
every request goes over loopback on a fresh connection, open loop at a constant rate.

1. **Classes**: a 3x overload made of a sheddable tenant (2.5x the capacity) beside a critical
   one (0.5x): the critical tenant's p99 (client side, connection included) against the SLO and
   its share of predictions (not defaults); then the same load with both tenants standard, to
   show what the classes change.
2. **Quotas**: a tenant sending 10x its quota (rate 10/s, burst 10) beside one without a quota
   at 0.4x the capacity: 200s and 429s for each, and the second tenant's p99.

It prints the figures and writes results.json under benchmarks/results/. The frontend and its
replica are stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cloudpickle
import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from tests.integration.frontend_process import FrontendProcess  # noqa: E402
from tests.integration.helpers import request  # noqa: E402

_seq = itertools.count()


def paced(xs: Any) -> list[float]:
    """5 ms a batch and 20 ms an input (time.sleep: the CPU stays free for the frontend)."""
    import time as t

    t.sleep(0.005 + 0.02 * len(xs))
    return [float(sum(x)) for x in xs]


class Frontend(FrontendProcess):
    @property
    def query_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.query}"


async def _one(fe: Frontend, key: str | None, out: list[tuple[float, int, bool, str]]) -> None:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["X-Api-Key"] = key
    body = orjson.dumps({"input": [float(next(_seq)), 1.0]})
    t0 = time.monotonic()
    try:
        resp = await request(
            f"{fe.query_url}/app/predict", "POST", body, headers=headers, limit_s=30
        )
    except (OSError, TimeoutError) as e:
        out.append((time.monotonic() - t0, 0, True, type(e).__name__))
        return
    doc = resp.json()
    default = resp.status != 200 or bool(doc.get("default"))
    # Why a default: the explanation's first words (the reason, in words).
    why = (
        ""
        if not default
        else " ".join(str(doc.get("default_explanation", resp.status)).split()[:4])
    )
    out.append((time.monotonic() - t0, resp.status, default, why))


async def _open_loop(
    fe: Frontend, key: str | None, rate: float, duration: float, out: list[Any]
) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks = []
    for i in range(int(rate * duration)):
        delay = start + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(_one(fe, key, out)))
    await asyncio.gather(*tasks)


def _p(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _summary(results: list[tuple[float, int, bool, str]]) -> dict[str, Any]:
    lat = [r[0] * 1e3 for r in results]
    statuses: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for _, status, _, why in results:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
        if why:
            reasons[why] = reasons.get(why, 0) + 1
    predicted = sum(1 for r in results if r[1] == 200 and not r[2])
    return {
        "requests": len(results),
        "statuses": statuses,
        "predictions": predicted,
        "prediction_share": predicted / len(results) if results else 0.0,
        "p50_ms": round(_p(lat, 0.50), 1),
        "p99_ms": round(_p(lat, 0.99), 1),
        "max_ms": round(max(lat), 1) if lat else None,
        "defaults": reasons,
    }


async def _capacity(fe: Frontend, seconds: float) -> float:
    """Inputs a second the replica answers with a closed loop of 8 (no tenants)."""
    done: list[Any] = []
    stop = time.monotonic() + seconds

    async def client() -> None:
        while time.monotonic() < stop:
            await _one(fe, None, done)

    t0 = time.monotonic()
    await asyncio.gather(*(client() for _ in range(8)))
    return sum(1 for r in done if r[1] == 200 and not r[2]) / (time.monotonic() - t0)


async def _key(fe: Frontend, tenant: str, **doc: Any) -> str:
    await fe.admin_ok("add_tenant", {"name": tenant, **doc})
    made = await fe.admin_ok("create_key", {"tenant": tenant})
    return str(made["key"])


async def run(duration: float, slo_ms: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        fe = Frontend(Path(tmp) / "state")
        artifact = Path(tmp) / "paced.pkl"
        artifact.write_bytes(cloudpickle.dumps(paced))
        await fe.start()
        try:
            await fe.admin_ok(
                "add_app",
                {"name": "app", "input_type": "doubles", "default_output": "-1",
                 "latency_slo_micros": slo_ms * 1000, "cache": False},
            )  # fmt: skip
            await fe.admin_ok(
                "deploy_model",
                {"model_name": "m", "model_version": "1", "input_type": "doubles",
                 "artifact_path": str(artifact), "num_replicas": 1,
                 "batching": {"controller": "fixed", "max_batch_size": 2}},
                limit_s=120,
            )  # fmt: skip
            await fe.admin_ok("add_model_links", {"app_name": "app", "model_names": ["m"]})
            capacity = await _capacity(fe, 5.0)
            print(f"capacity: {capacity:.1f} inputs/s (closed loop of 8)")
            out: dict[str, Any] = {"capacity_rps": round(capacity, 1), "slo_ms": slo_ms}

            gold = await _key(fe, "gold", priority="critical")
            bulk = await _key(fe, "bulk", priority="sheddable")
            plain_a = await _key(fe, "plain-a", priority="standard")
            plain_b = await _key(fe, "plain-b", priority="standard")
            for label, crit_key, shed_key in (
                ("all standard", plain_a, plain_b),
                ("classes", gold, bulk),
            ):
                crit: list[Any] = []
                shed: list[Any] = []
                await asyncio.gather(
                    _open_loop(fe, crit_key, 0.5 * capacity, duration, crit),
                    _open_loop(fe, shed_key, 2.5 * capacity, duration, shed),
                )
                out[label] = {"critical": _summary(crit), "sheddable": _summary(shed)}
                c, s = out[label]["critical"], out[label]["sheddable"]
                print(
                    f"3x overload, {label}: first tenant p99 {c['p99_ms']} ms (SLO {slo_ms}), "
                    f"{100 * c['prediction_share']:.2f}% predictions of {c['requests']}; "
                    f"second tenant {100 * s['prediction_share']:.1f}% of {s['requests']}"
                )
                print(f"  first tenant's defaults: {c['defaults']}")
                await asyncio.sleep(3.0)  # the queue drains between runs

            noisy = await _key(fe, "noisy", quotas={"*": {"rate": 10, "burst": 10}})
            await asyncio.sleep(3.0)
            calm = await _key(fe, "calm")
            loud: list[Any] = []
            quiet: list[Any] = []
            await asyncio.gather(
                _open_loop(fe, noisy, 100.0, duration, loud),
                _open_loop(fe, calm, 0.4 * capacity, duration, quiet),
            )
            out["quota"] = {"noisy": _summary(loud), "calm": _summary(quiet)}
            n, q = out["quota"]["noisy"], out["quota"]["calm"]
            print(
                f"10x quota: noisy {n['statuses']} ({n['requests'] / duration:.0f}/s offered, "
                f"quota 10/s); calm {q['statuses']}, {100 * q['prediction_share']:.1f}% "
                f"predictions, p99 {q['p99_ms']} ms"
            )
            return out
        finally:
            fe.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=20.0, help="seconds per run")
    p.add_argument("--slo-ms", type=int, default=300)
    args = p.parse_args(argv)
    results = asyncio.run(run(args.duration, args.slo_ms))
    out_dir = HERE / "results" / f"tenants-{time.strftime('%Y%m%d-%H%M%S')}"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    print(f"wrote {out_dir / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
