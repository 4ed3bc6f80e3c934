"""The dashboard in a real headless Chromium (Debian's ``chromium``, driven by Playwright with
``executable_path``: no browser is downloaded).

One frontend with an admin token, three models and three applications under load: the page loads
with no console error, asks for the token, then its plots move (the throughput plot gains points
and its line is redrawn); a replica killed with SIGKILL (its pid read from the admin API) shows
as ``restarting`` and then ``ready`` again in the replicas table. A screenshot is taken under
load (``CLIPPER_DASHBOARD_SCREENSHOT=path`` keeps it, as docs/dashboard.png was made).

About 45 s of load, so it is one of the ``slow`` scenarios (``-m slow``, as ``.ci/run`` runs
them), kept out of the README's test command. Skipped when playwright or chromium is missing,
unless ``CLIPPER_REQUIRE_BROWSER`` is set (as .ci/run sets it): then it fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from clipper import Clipper
from tests.integration import models
from tests.integration.helpers import post_json, request, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.slow]

TOKEN = "dashboard-test-token"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SAMPLE_S = 0.25
HISTORY_S = 45.0
IDLE_APPS = 6


def _playwright() -> Any:
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        return None
    return async_playwright


def _require_browser() -> Any:
    missing = []
    launcher = _playwright()
    if launcher is None:
        missing.append("the playwright package (pip install playwright)")
    if CHROMIUM is None:
        missing.append("a chromium binary on PATH (apt-get install chromium)")
    if missing:
        why = "the browser test needs " + " and ".join(missing)
        if os.environ.get("CLIPPER_REQUIRE_BROWSER"):
            pytest.fail(f"{why} (CLIPPER_REQUIRE_BROWSER is set)")
        pytest.skip(why)
    return launcher


@contextlib.asynccontextmanager
async def load(c: Clipper, stop_after_s: float = 120.0) -> AsyncIterator[dict[str, int]]:
    """Four clients sending queries (and feedback to the learning application) until the block
    ends or ``stop_after_s`` passes; yields the counts so far."""
    counts = {"queries": 0, "feedback": 0, "errors": 0}
    deadline = time.monotonic() + stop_after_s
    stop = asyncio.Event()
    rng = random.Random(13)

    async def client() -> None:
        while not stop.is_set() and time.monotonic() < deadline:
            # Mostly new inputs (batches to the models), some repeated (cache hits).
            x = float(rng.randint(0, 20) if rng.random() < 0.3 else rng.randint(21, 10**6))
            try:
                await post_json(f"{c.query_url}/sums/predict", {"input": [x, 1.0]})
                await post_json(f"{c.query_url}/pick/predict", {"input": [x]})
                counts["queries"] += 2
                if rng.random() < 0.1:  # an application with no model: a default, always
                    await post_json(f"{c.query_url}/lonely/predict", {"input": [x]})
                    counts["queries"] += 1
                if rng.random() < 0.3:  # a model that raises on every query
                    await post_json(f"{c.query_url}/broken/predict", {"input": [x]})
                    counts["queries"] += 1
                if rng.random() < 0.3:
                    await post_json(f"{c.query_url}/pick/update", {"input": [x], "label": int(x)})
                    counts["feedback"] += 1
            except (OSError, TimeoutError, asyncio.IncompleteReadError):
                counts["errors"] += 1
                await asyncio.sleep(0.05)

    tasks = [asyncio.create_task(client()) for _ in range(4)]
    try:
        yield counts
    finally:
        stop.set()
        await asyncio.gather(*tasks)


async def _admin(c: Clipper, route: str, doc: Any) -> Any:
    resp = await request(
        f"{c.admin_url}/admin/{route}", "POST", orjson.dumps(doc),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )  # fmt: skip
    assert resp.status == 200, resp.body
    return resp.json()


async def test_the_dashboard_in_headless_chromium(tmp_path: Path) -> None:
    launcher = _require_browser()
    started = time.monotonic()
    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, admin_token=TOKEN,
        dashboard_sample_s=SAMPLE_S, dashboard_history_s=HISTORY_S,
    ) as c:  # fmt: skip
        await c.deploy_model("summer", "1", models.row_sums, input_type="doubles", num_replicas=2)
        await c.deploy_model("right", "1", models.label_of, input_type="doubles")
        await c.deploy_model("wrong", "1", models.off_by_one, input_type="doubles", num_replicas=2)
        await c.register_application("sums", "doubles", "-1", 20_000)
        await c.link_model_to_app("sums", "summer")
        await c.register_application("pick", "doubles", "-1", 50_000, policy="exp3")
        await c.link_model_to_app("pick", "right")
        await c.link_model_to_app("pick", "wrong")
        await c.register_application("lonely", "doubles", "-1", 20_000)  # linked to nothing
        await c.deploy_model("chatty", "1", models.chatty_failure, input_type="doubles")
        await c.register_application("broken", "doubles", "-1", 50_000, cache=False)
        await c.link_model_to_app("broken", "chatty")
        # Rollouts: a split of summer between two versions, a shadow of right that agrees.
        for name, fn in (("summer", models.row_sums), ("right", models.label_of)):
            await c.deploy_model(
                name, "2", fn, input_type="doubles", set_current=False, retire_previous=False
            )
        await c.set_traffic_split("summer", {"1": 80, "2": 20})
        await c.set_shadow("right", "2", 1.0)
        # An application queried only now (its p99 goes stale), and idle ones (never queried).
        await c.register_application("once", "doubles", "-1", 20_000)
        await c.link_model_to_app("once", "summer")
        for i in range(5):
            await post_json(f"{c.query_url}/once/predict", {"input": [float(i), 2.0]})
        for i in range(IDLE_APPS):
            await c.register_application(f"idle{i}", "doubles", "-1", 30_000)
        deployed = time.monotonic()
        # The data needs the token; the page does not (a browser cannot send one on load).
        assert (await request(f"{c.admin_url}/dashboard/events")).status == 401
        assert (await request(f"{c.admin_url}/dashboard")).status == 200

        async with launcher() as p:
            browser = await p.chromium.launch(
                executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
            )
            try:
                page = await browser.new_page(viewport={"width": 1280, "height": 1000})
                problems: list[str] = []
                page.on(
                    "console",
                    lambda m: problems.append(f"console {m.type}: {m.text}")
                    if m.type in ("error", "warning") else None,
                )  # fmt: skip
                page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
                await page.goto(f"{c.admin_url}/dashboard", wait_until="load")
                loaded = time.monotonic()
                await page.wait_for_selector("#login:not([hidden])", timeout=15_000)
                await page.fill("#token", TOKEN)
                await page.click("#login button")
                await page.wait_for_selector("#main:not([hidden])", timeout=15_000)
                assert await page.get_attribute("#status", "data-status") == "live"

                async def samples() -> int:
                    return int(await page.get_attribute("body", "data-samples") or 0)

                async def qps_plot() -> tuple[int, float, str]:
                    """Points with queries in the throughput plot of 'sums', the latest
                    value, and the drawn line's SVG path."""
                    doc = await page.evaluate(
                        """() => {
                          const gd = document.getElementById('plot-qps');
                          const t = (gd.data || []).find((d) => d.name === 'sums');
                          const path = gd.querySelector('.scatterlayer .trace path.js-line');
                          return {y: t ? t.y : [], d: path ? path.getAttribute('d') : ''};
                        }"""
                    )
                    ys = [v for v in doc["y"] if v]
                    return len(ys), (ys[-1] if ys else 0.0), doc["d"]

                async with load(c) as counts:
                    await wait_for(lambda: counts["queries"] > 50, limit_s=30, what="load")
                    n0 = await samples()
                    await wait_for(
                        lambda: _gt(samples(), n0 + 8), limit_s=20, what="8 more samples"
                    )
                    points1, _, path1 = await qps_plot()
                    await wait_for(
                        lambda: _gt(samples(), n0 + 16), limit_s=20, what="16 more samples"
                    )
                    points2, last_qps, path2 = await qps_plot()
                    assert points2 > points1 > 0, (points1, points2)
                    assert last_qps > 0
                    assert path1 and path2 and path1 != path2  # the line was redrawn
                    # Every plot has drawn data under load.
                    drawn = await page.evaluate(
                        """() => [...document.querySelectorAll('.plot')].map((gd) => [
                          gd.id, (gd.data || []).reduce(
                            (n, t) => n + (t.y || []).filter((v) => v !== null).length, 0)])"""
                    )
                    empty = [name for name, n in drawn if n == 0]
                    assert not empty, f"plots with no data under load: {empty}"
                    reasons = await page.evaluate(
                        "() => document.getElementById('plot-defaults').data.map((t) => t.name)"
                    )
                    assert "lonely: no_model" in reasons
                    assert {"plot-latency-sums", "plot-latency-pick", "plot-weights-pick"} <= {
                        name for name, _ in drawn
                    }

                    # The model failing every query: not ready, with its error rate, in the
                    # applications and models tables; the healthy ones stay ready.
                    async def failing_shown() -> Any:
                        return await page.evaluate(
                            """() => {
                              const a = document.querySelector('#apps tr[data-app="broken"]');
                              const s = document.querySelector('#apps tr[data-app="sums"]');
                              const m = [...document.querySelectorAll('#models tbody tr')]
                                .find((r) => r.cells[0].textContent === 'chatty');
                              if (!a || !s || !m || a.dataset.ready !== 'no') return null;
                              return {app: [...a.cells].map((td) => td.textContent),
                                      sums: s.dataset.ready, model: m.dataset.failing,
                                      modelCells: [...m.cells].map((td) => td.textContent),
                                      why: a.cells[a.cells.length - 1].title};
                            }"""
                        )

                    await wait_for(
                        failing_shown, limit_s=30, interval=0.2,
                        what="the failing model's application shown as not ready",
                    )  # fmt: skip
                    shown_failing = await failing_shown()
                    # The rates count queries sent: one still at the replica when the minute's
                    # window was read is neither an error nor an answer yet (CI saw 99.8%).
                    app_errors, app_defaults, app_ready = shown_failing["app"][-3:]
                    assert float(app_errors.rstrip("%")) >= 99.0, shown_failing["app"]
                    assert float(app_defaults.rstrip("%")) >= 99.0, shown_failing["app"]
                    assert app_ready == "not ready"
                    assert "model 'chatty:1' answered" in shown_failing["why"]
                    assert shown_failing["sums"] == "yes" and shown_failing["model"] == "yes"
                    assert shown_failing["modelCells"][-3] == "100.0%"
                    # Defaults count inputs sent: one still at the replica when the minute's
                    # window was read has no answer yet, neither a prediction nor a default.
                    assert float(shown_failing["modelCells"][-2].rstrip("%")) >= 99.0
                    assert shown_failing["modelCells"][-1] == "failing"

                    # An autoscaling decision (wrong:1 given 2 replicas, at most 1 allowed): in the
                    # decisions table and as a marker on the replicas plot, whose wanted line
                    # steps from 2 to 1.
                    # Setting the bounds clamps the count at once; a count set outside them
                    # afterwards is the autoscaler's to correct.
                    await c.set_autoscale("wrong", "1", min_replicas=1, max_replicas=1)
                    await c.set_num_replicas("wrong", 2, "1", wait=False)  # the autoscaler cuts it
                    await wait_for(
                        lambda: page.evaluate(
                            """() => !!document.querySelector(
                              '#decisions tr[data-model="wrong:1"][data-reason="max_replicas"]')"""
                        ),
                        limit_s=30, interval=0.2, what="the autoscaling decision in its table",
                    )  # fmt: skip
                    decision_row = await page.evaluate(
                        """() => [...document.querySelector('#decisions tr[data-model="wrong:1"]')
                          .cells].map((td) => td.textContent)"""
                    )
                    assert decision_row[2] == "2 → 1" and decision_row[3] == "max_replicas"

                    async def replicas_plot() -> Any:
                        return await page.evaluate(
                            """() => {
                              const gd = document.getElementById('plot-replicas');
                              const by = (n) => (gd.data || []).find((t) => t.name === n);
                              const marks = by('autoscaling decisions');
                              const wanted = by('wrong:1 wanted');
                              return {marks: marks ? marks.text : [], ys: marks ? marks.y : [],
                                      wanted: wanted ? wanted.y.filter((v) => v !== null) : []};
                            }"""
                        )

                    async def stepped() -> bool:
                        doc = await replicas_plot()
                        return bool(doc["marks"]) and doc["wanted"][-1:] == [1]

                    await wait_for(stepped, limit_s=15, interval=0.2, what="wanted 2 → 1 drawn")
                    rp = await replicas_plot()
                    assert any("wrong:1 2 → 1: max_replicas" in t for t in rp["marks"]), rp
                    assert 2 in rp["wanted"] and 1 in rp["ys"]

                    # The split and the shadow: in the rollouts table and their plots.
                    async def rollouts() -> Any:
                        return await page.evaluate(
                            """() => {
                              const row = (m) => {
                                const tr = document.querySelector(
                                  `#rollouts tr[data-model="${m}"]`);
                                return tr ? [...tr.cells].map((td) => td.textContent) : null;
                              };
                              const ys = (id, n) => {
                                const gd = document.getElementById(id);
                                const t = (gd.data || []).find((d) => d.name === n);
                                return t ? t.y.filter((v) => v !== null) : [];
                              };
                              return {summer: row('summer'), right: row('right'),
                                      split1: ys('plot-split', 'summer:1'),
                                      split2: ys('plot-split', 'summer:2'),
                                      shadow: ys('plot-shadow', 'right:2'),
                                      hidden: [document.getElementById('plot-split').hidden,
                                               document.getElementById('plot-shadow').hidden]};
                            }"""
                        )

                    async def rollouts_shown() -> bool:
                        r = await rollouts()
                        return bool(r["right"] and r["right"][5].endswith("%") and r["split2"])

                    await wait_for(
                        rollouts_shown, limit_s=30, interval=0.2, what="split and shadow shown"
                    )  # fmt: skip
                    ro = await rollouts()
                    assert ro["summer"][:3] == ["summer", "1", "1: 80%, 2: 20%"], ro
                    assert ro["right"][4] == "2 (100%)" and ro["right"][5] == "100.0%", ro
                    assert ro["hidden"] == [False, False]
                    # Shares of one model's split queries: each point's pair sums to 1.
                    assert all(0.0 <= v <= 1.0 for v in ro["split1"] + ro["split2"])
                    assert sum(ro["split2"]) < sum(ro["split1"])  # 20% against 80%
                    assert ro["shadow"] and all(v == 1.0 for v in ro["shadow"])

                    # The SLO line spans the whole x range; the axis keeps it in view and
                    # nothing drawn is above the axis's top (spikes are clipped and marked).
                    lat = await page.evaluate(
                        """() => {
                          const gd = document.getElementById('plot-latency-sums');
                          const by = (n) => gd.data.find((t) => t.name === n);
                          const drawn = ['p50', 'p99'].flatMap((n) => by(n).y)
                            .filter((v) => v !== null);
                          return {slo: by('SLO'), top: gd.layout.yaxis.range[1],
                                  drawnMax: Math.max(...drawn), clipped: by('clipped').y.length,
                                  marked: Number(gd.dataset.clipped)};
                        }"""
                    )
                    assert lat["slo"]["x"] == [-HISTORY_S, 0] and lat["slo"]["y"] == [20, 20]
                    assert lat["top"] >= 3 * 20
                    assert lat["drawnMax"] <= lat["top"]
                    assert lat["clipped"] == lat["marked"]
                    # The page's own rule on a spike: 400 ms against a 20 ms SLO is clipped.
                    rule = await page.evaluate(
                        """() => {
                          const a = window.clipperDashboard.latencyAxis(
                            [...Array(200).fill(5), 400], 20);
                          return [a.top, a.clipped(400), a.clipped(59)];
                        }"""
                    )
                    assert rule == [60, True, False]

                    # Idle applications are one closed row each; a click opens one, with its
                    # SLO line across the whole range though it has no sample.
                    rows = await page.evaluate(
                        """() => [...document.querySelectorAll('#apps-list .app-row')].map(
                          (r) => [r.dataset.app, r.dataset.expanded, r.offsetHeight,
                                  r.querySelectorAll('.plot').length])"""
                    )
                    by_app = {name: (open_, h, plots) for name, open_, h, plots in rows}
                    assert len(by_app) == 5 + IDLE_APPS
                    for i in range(IDLE_APPS):
                        open_, h, plots = by_app[f"idle{i}"]
                        assert (open_, plots) == ("no", 0) and h < 40, by_app[f"idle{i}"]
                    assert by_app["sums"][0] == "yes" and by_app["sums"][1] > 150
                    await page.click('.app-row[data-app="idle3"] .app-head')
                    opened = await page.evaluate(
                        """() => {
                          const gd = document.getElementById('plot-latency-idle3');
                          const slo = gd && gd.data && gd.data.find((t) => t.name === 'SLO');
                          return slo ? [slo.x, slo.y] : null;
                        }"""
                    )
                    assert opened == [[-HISTORY_S, 0], [30, 30]]
                    await page.click('.app-row[data-app="idle3"] .app-head')
                    assert (
                        await page.get_attribute('.app-row[data-app="idle3"]', "data-expanded")
                        == "no"
                    )

                    # The app queried only before the load: its p99 is stale, greyed with its
                    # age, and its row closes.
                    async def stale() -> Any:
                        return await page.evaluate(
                            """() => {
                              const tr = document.querySelector('#apps tr[data-app="once"]');
                              const row = document.querySelector('.app-row[data-app="once"]');
                              const td = tr && tr.cells[6];
                              return td && td.dataset.stale === 'yes'
                                ? [td.textContent, row.dataset.expanded] : null;
                            }"""
                        )

                    await wait_for(stale, limit_s=40, interval=0.2, what="a stale p99 marked")
                    text, once_open = await stale()
                    assert text.endswith(" s ago)") and " ms (" in text, text
                    assert once_open == "no"

                    shot = os.environ.get("CLIPPER_DASHBOARD_SCREENSHOT")
                    if shot:  # for the docs: let the load fill more of the plots first
                        await wait_for(
                            lambda: _gt(samples(), n0 + 100), limit_s=60, what="100 samples"
                        )
                    shot = shot or str(tmp_path / "dashboard.png")
                    png = await page.screenshot(path=shot, full_page=True)
                    assert png[:8] == b"\x89PNG\r\n\x1a\n"

                    # Kill one replica of summer; its pid comes from the admin API.
                    replicas = await _admin(c, "get_replicas", {"model_name": "summer"})
                    victim = next(r["pid"] for r in replicas if r["pid"])
                    slot = await page.evaluate(
                        """(pid) => {
                          const rows = [...document.querySelectorAll('#replicas tbody tr')];
                          const tr = rows.find((r) => r.cells[3].textContent === String(pid));
                          return tr ? tr.dataset.slot : null;
                        }""",
                        victim,
                    )
                    assert slot, f"no row of the dashboard shows pid {victim}"
                    row = f'tr[data-model="summer"][data-slot="{slot}"]'
                    cell = f"#replicas {row}"
                    # Every state the page shows for that row, as the page shows it (polling
                    # from here could miss a short one while the renderer is busy drawing).
                    # Each rendering of the table adds new rows: the observer gets every one,
                    # even when two renderings fall in one task.
                    await page.evaluate(
                        """(sel) => {
                          const seen = window.shownStates = [];
                          const note = (row) => {
                            const s = row.dataset.state;
                            if (s && seen[seen.length - 1] !== s) seen.push(s);
                          };
                          const body = document.querySelector('#replicas tbody');
                          new MutationObserver((records) => {
                            for (const r of records) for (const n of r.addedNodes) {
                              if (n.nodeType === 1 && n.matches(sel)) note(n);
                            }
                          }).observe(body, {childList: true});
                          const now = body.querySelector(sel);
                          if (now) note(now);
                        }""",
                        row,
                    )
                    os.kill(victim, signal.SIGKILL)
                    killed = time.monotonic()
                    seen: list[str] = []

                    async def shown(*states: str) -> bool:
                        seen[:] = await page.evaluate("() => window.shownStates")
                        it = iter(seen)
                        return all(s in it for s in states)  # in this order

                    await wait_for(
                        lambda: shown("restarting"), limit_s=15, interval=0.05,
                        what="the killed replica to show as restarting",
                    )  # fmt: skip
                    await wait_for(
                        lambda: shown("restarting", "ready"), limit_s=30, interval=0.05,
                        what="the restarted replica to show as ready",
                    )  # fmt: skip
                    recovered = time.monotonic()
                    restarts = await page.locator(f"{cell} td").nth(4).text_content()
                    assert restarts == "1"
                    new_pid = await page.locator(f"{cell} td").nth(3).text_content()
                    assert new_pid is not None and new_pid.isdigit() and new_pid != str(victim)
                total_samples = await samples()
                assert not problems, problems
            finally:
                await browser.close()
        print(
            f"\ndashboard browser test: deploy {deployed - started:.1f} s, page load "
            f"{loaded - deployed:.1f} s, {counts['queries']} queries and {counts['feedback']} "
            f"feedback under load ({counts['errors']} client errors), {total_samples} samples "
            f"drawn, killed replica seen as {seen} and ready after {recovered - killed:.1f} s"
        )


async def _gt(n: Any, target: int) -> bool:
    return int(await n) > target
