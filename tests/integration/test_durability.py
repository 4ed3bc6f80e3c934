"""Acknowledged means durable: SIGKILL a real ``clipper start`` frontend around admin calls,
restart it on the same state directory, and check. Every test runs on both stores: SQLite in the
state directory, and a real ``redis-server`` started by this module (skipped without one unless
``CLIPPER_REQUIRE_REDIS`` is set).

Contract:

* a 200 from a mutating admin call (``add_app``, ``update_app``, ``delete_app``) means the change
  is committed: after a SIGKILL, however soon after the answer, the restarted frontend has it
  (and a deleted application does not come back); calls that got no answer may go either way;
* ``deploy_model`` / ``set_model_version`` killed at any moment leave no replica serving a version
  that is not current, no replica process of the killed frontend alive, the killed deploy's
  version absent or current, and the same ``deploy_model`` call, retried, answers 200.

Rounds: ``CLIPPER_KILL_ROUNDS`` (default 3) for the normal run; the ``kill``-marked variants run
``CLIPPER_KILL_ROUNDS_LONG`` (default 20) and only when selected (``-m kill``) or when
``CLIPPER_KILL_LONG=1``. ``CLIPPER_KILL_SEED`` replays a run (every failure names its seed).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from tests.integration import models
from tests.integration.frontend_process import FrontendProcess, container_pids, live
from tests.integration.helpers import Response, wait_for
from tests.integration.redis_server import REDIS_SERVER, start_redis, stop_redis

pytestmark = pytest.mark.integration

ROUNDS = int(os.environ.get("CLIPPER_KILL_ROUNDS", "3"))
LONG_ROUNDS = int(os.environ.get("CLIPPER_KILL_ROUNDS_LONG", "20"))
INPUT_TYPES = ("doubles", "integers", "floats", "strings", "bytes")
SETTINGS = ("input_type", "default_output", "latency_slo_micros")
ORPHAN_GRACE_S = 10.0  # a replica polls its parent every 0.1 s; 10 s is a generous bound


def round_timeout(rounds: int) -> pytest.MarkDecorator:
    """A per-test timeout that grows with the round count: the slowest test takes about 4.5 s
    a round here, so 15 s a round leaves room for a loaded CI machine; never below the
    suite's default (pyproject's ``timeout``)."""
    return pytest.mark.timeout(max(120, 15 * rounds))


ROUND_PARAMS = [
    pytest.param(ROUNDS, id="rounds", marks=round_timeout(ROUNDS)),
    pytest.param(LONG_ROUNDS, id="long", marks=[pytest.mark.kill, round_timeout(LONG_ROUNDS)]),
]


@pytest.fixture
def rounds(request: pytest.FixtureRequest) -> int:
    """The parametrized round count; the long (``kill``) variant only when asked for."""
    n: int = request.param
    markexpr = str(request.config.getoption("markexpr", "") or "")
    asked = ("kill" in markexpr and "not kill" not in markexpr) or (
        os.environ.get("CLIPPER_KILL_LONG") == "1"
    )
    if request.node.get_closest_marker("kill") is not None and not asked:
        pytest.skip("long kill variant: run with -m kill (or CLIPPER_KILL_LONG=1)")
    return n


@pytest.fixture
def seed() -> int:
    return int(os.environ.get("CLIPPER_KILL_SEED") or random.SystemRandom().randrange(2**32))


@pytest.fixture(scope="module")
def redis_port() -> Iterator[int]:
    if REDIS_SERVER is None:
        if os.environ.get("CLIPPER_REQUIRE_REDIS"):
            pytest.fail("redis-server is required (CLIPPER_REQUIRE_REDIS) and not installed")
        pytest.skip("redis-server is not installed (apt-get install -y redis-server)")
    proc, port = start_redis()
    try:
        yield port
    finally:
        stop_redis(proc)


@pytest.fixture(params=["sqlite", "redis"])
def frontend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FrontendProcess]:
    store = None  # the CLI's default: SQLite in the state directory
    if request.param == "redis":
        port: int = request.getfixturevalue("redis_port")
        store = f"redis://127.0.0.1:{port}/0?prefix=t{uuid.uuid4().hex[:8]}"
    fe = FrontendProcess(tmp_path / "state", store=store)
    try:
        yield fe
    finally:
        fe.cleanup()


# -- applications: what was acknowledged, and what the restarted frontend must show -------------


@dataclass
class Expected:
    """What one application may look like after a restart."""

    settings: dict[str, Any]
    present: bool | None  # None: either (a call on it got no answer)
    slos: set[int] = field(default_factory=set)  # allowed latency_slo_micros when present


@dataclass
class Ledger:
    seed: int
    apps: dict[str, Expected] = field(default_factory=dict)
    acknowledged: int = 0
    unanswered: int = 0
    violations: dict[str, str] = field(default_factory=dict)  # name -> first violation seen
    rounds_done: int = 0

    def add_app(self, spec: dict[str, Any], resp: Response | BaseException) -> None:
        settings = {k: spec[k] for k in SETTINGS}
        if _acked(resp, "add_app", spec):
            self.acknowledged += 1
            self.apps[spec["name"]] = Expected(settings, True, {spec["latency_slo_micros"]})
        else:
            self.unanswered += 1
            self.apps[spec["name"]] = Expected(settings, None, {spec["latency_slo_micros"]})

    def update_app(self, name: str, slo: int, resp: Response | BaseException) -> None:
        exp = self.apps[name]
        if _acked(resp, "update_app", {"name": name}):
            self.acknowledged += 1
            exp.present, exp.slos = True, {slo}
        else:
            self.unanswered += 1
            exp.slos.add(slo)

    def delete_app(self, name: str, resp: Response | BaseException) -> None:
        exp = self.apps[name]
        if _acked(resp, "delete_app", {"name": name}):
            self.acknowledged += 1
            exp.present = False
        else:
            self.unanswered += 1
            exp.present = None

    def check(self, listed: list[dict[str, Any]]) -> None:
        """Compare the restarted frontend's ``get_all_applications`` with the ledger."""
        got = {a["name"]: a for a in listed}
        for name, exp in self.apps.items():
            app = got.get(name)
            problem: str | None = None
            if app is None:
                if exp.present is True:
                    problem = "lost: acknowledged, missing after the restart"
            elif exp.present is False:
                problem = "resurrected: delete acknowledged, present after the restart"
            else:
                want = {**exp.settings}
                have = {k: app.get(k) for k in SETTINGS}
                if have["latency_slo_micros"] in exp.slos:
                    want["latency_slo_micros"] = have["latency_slo_micros"]
                if have != want:
                    problem = f"wrong settings: acknowledged {want} (SLO one of "
                    problem += f"{sorted(exp.slos)}), restarted frontend has {have}"
            if problem is not None:
                self.violations.setdefault(name, f"round {self.rounds_done}: {problem}")

    def summary(self) -> str:
        kinds = {"lost": 0, "resurrected": 0, "wrong settings": 0}
        for v in self.violations.values():
            for k in kinds:
                if f": {k}" in v:
                    kinds[k] += 1
        first = "\n  ".join(f"{n}: {v}" for n, v in sorted(self.violations.items())[:10])
        return (
            f"{self.acknowledged} acknowledged and {self.unanswered} unanswered calls over "
            f"{self.rounds_done} SIGKILL rounds (CLIPPER_KILL_SEED={self.seed}): "
            f"{len(self.violations)} applications wrong after a restart "
            f"(lost {kinds['lost']}, resurrected {kinds['resurrected']}, "
            f"wrong settings {kinds['wrong settings']}); first ones:\n  {first}"
        )


def _acked(resp: Response | BaseException, route: str, doc: dict[str, Any]) -> bool:
    """True for a 200; False for no answer (the kill); any other answer fails the test."""
    if isinstance(resp, BaseException):
        if isinstance(resp, (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError)):
            return False
        raise resp
    assert resp.status == 200, f"{route} {doc!r} answered {resp.status}: {resp.body[:300]!r}"
    return True


def app_spec(name: str, rng: random.Random) -> dict[str, Any]:
    return {
        "name": name,
        "input_type": rng.choice(INPUT_TYPES),
        "default_output": f"default-{name}-{rng.randrange(10**6)}",
        "latency_slo_micros": rng.randrange(1_000, 10_000_000),
    }


async def calls(fe: FrontendProcess, *work: tuple[str, dict[str, Any]]) -> list[Any]:
    """Concurrent admin calls, as tasks (so a kill can land while they are in flight)."""
    tasks = [asyncio.ensure_future(fe.admin(route, doc, limit_s=10.0)) for route, doc in work]
    return list(await asyncio.gather(*tasks, return_exceptions=True))


async def kill_at_random_moment(
    fe: FrontendProcess, rng: random.Random, *work: tuple[str, dict[str, Any]]
) -> list[Any]:
    """Send the calls concurrently and SIGKILL the frontend 0-40 ms later."""
    tasks = [asyncio.ensure_future(fe.admin(route, doc, limit_s=10.0)) for route, doc in work]
    await asyncio.sleep(rng.uniform(0.0, 0.04))
    fe.kill()
    return list(await asyncio.gather(*tasks, return_exceptions=True))


async def restart_and_check(fe: FrontendProcess, ledger: Ledger) -> None:
    await fe.start()
    ledger.rounds_done += 1
    ledger.check(await fe.apps())


@pytest.mark.parametrize("rounds", ROUND_PARAMS, indirect=True)
async def test_add_app_acknowledged_then_sigkill_at_once_is_durable(
    frontend: FrontendProcess, rounds: int, seed: int
) -> None:
    """Bursts of 1-20 concurrent add_app; SIGKILL 0 ms after the last 200; restart; all there."""
    rng, ledger = random.Random(seed), Ledger(seed)
    await frontend.start()
    for r in range(rounds):
        specs = [app_spec(f"r{r}-a{i}", rng) for i in range(rng.randint(1, 20))]
        answers = await calls(frontend, *(("add_app", s) for s in specs))
        frontend.kill()
        for spec, resp in zip(specs, answers, strict=True):
            assert not isinstance(resp, BaseException), f"add_app {spec} before the kill: {resp!r}"
            ledger.add_app(spec, resp)
        await restart_and_check(frontend, ledger)
    assert not ledger.violations, ledger.summary()


@pytest.mark.parametrize("rounds", ROUND_PARAMS, indirect=True)
async def test_add_app_sigkill_while_calls_are_in_flight_keeps_every_acknowledged_app(
    frontend: FrontendProcess, rounds: int, seed: int
) -> None:
    """SIGKILL 0-40 ms into a burst of 5-20 add_app: every app that got a 200 is there."""
    rng, ledger = random.Random(seed), Ledger(seed)
    await frontend.start()
    for r in range(rounds):
        specs = [app_spec(f"r{r}-b{i}", rng) for i in range(rng.randint(5, 20))]
        answers = await kill_at_random_moment(frontend, rng, *(("add_app", s) for s in specs))
        for spec, resp in zip(specs, answers, strict=True):
            ledger.add_app(spec, resp)
        await restart_and_check(frontend, ledger)
    assert not ledger.violations, ledger.summary()


@pytest.mark.parametrize("rounds", ROUND_PARAMS, indirect=True)
async def test_update_and_delete_app_acknowledged_survive_sigkill(
    frontend: FrontendProcess, rounds: int, seed: int
) -> None:
    """Each round: add 4-12 apps, then concurrently update the SLO of some and delete the
    others; SIGKILL 0 ms after the last answer (even rounds) or 0-40 ms into the burst (odd).
    After the restart: acknowledged updates have the new SLO, acknowledged deletes stay deleted,
    acknowledged adds exist."""
    rng, ledger = random.Random(seed), Ledger(seed)
    await frontend.start()
    for r in range(rounds):
        specs = [app_spec(f"r{r}-c{i}", rng) for i in range(rng.randint(4, 12))]
        added = await calls(frontend, *(("add_app", s) for s in specs))
        for spec, resp in zip(specs, added, strict=True):
            assert not isinstance(resp, BaseException), f"add_app {spec}: {resp!r}"
            ledger.add_app(spec, resp)
        work: list[tuple[str, dict[str, Any]]] = []
        for spec in specs:
            if rng.random() < 0.5:
                slo = spec["latency_slo_micros"] + rng.randrange(1, 1_000_000)
                work.append(("update_app", {"name": spec["name"], "latency_slo_micros": slo}))
            else:
                work.append(("delete_app", {"name": spec["name"]}))
        rng.shuffle(work)
        if r % 2 == 0:
            answers = await calls(frontend, *work)
            frontend.kill()
            assert not any(isinstance(a, BaseException) for a in answers), answers
        else:
            answers = await kill_at_random_moment(frontend, rng, *work)
        for (route, doc), resp in zip(work, answers, strict=True):
            if route == "update_app":
                ledger.update_app(doc["name"], doc["latency_slo_micros"], resp)
            else:
                ledger.delete_app(doc["name"], resp)
        await restart_and_check(frontend, ledger)
    assert not ledger.violations, ledger.summary()


# -- versions: deploy_model / set_model_version killed mid-call --------------------------------

MODEL = "m"
REPLICAS = 2


class SlowStart:
    """Row sums, with a ``setup()`` that takes STARTUP_S: a deploy then spans most of the
    0-1.5 s kill window instead of finishing before it on a fast machine."""

    def __init__(self, startup_s: float) -> None:
        self.startup_s = startup_s

    def setup(self) -> None:
        time.sleep(self.startup_s)

    def predict(self, xs: Any) -> list[float]:
        return models.row_sums(xs)


STARTUP_S = 0.7


def write_artifact(directory: Path, version: str) -> str:
    """A cloudpickle file of a :class:`SlowStart`, pickled by value (the container does not
    import the tests)."""
    path = directory / f"slow-start-v{version}.pkl"
    this = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(models)
    cloudpickle.register_pickle_by_value(this)
    try:
        path.write_bytes(cloudpickle.dumps(SlowStart(STARTUP_S)))
    finally:
        cloudpickle.unregister_pickle_by_value(this)
        cloudpickle.unregister_pickle_by_value(models)
    return str(path)


def deploy_doc(artifact: str, version: str) -> dict[str, Any]:
    return {
        "model_name": MODEL,
        "model_version": version,
        "input_type": "doubles",
        "artifact_path": artifact,
        "num_replicas": REPLICAS,
    }


async def current_versions(fe: FrontendProcess) -> dict[str, list[str]]:
    """model -> its versions, the current one first (``[]`` for none)."""
    found: list[dict[str, Any]] = await fe.admin_ok("get_all_models", {"verbose": True})
    out: dict[str, list[str]] = {}
    for m in sorted(found, key=lambda m: not m["is_current_version"]):
        out.setdefault(m["model_name"], []).append(m["model_version"])
    return out


async def settled_replicas(fe: FrontendProcess, *, limit_s: float = 45.0) -> list[dict[str, Any]]:
    """Poll get_replicas until the current version of MODEL has its REPLICAS replicas and the set
    of connected replicas has not changed for 1.5 s."""
    seen: list[Any] = []
    state: dict[str, Any] = {"key": None, "since": 0.0, "replicas": []}
    loop = asyncio.get_running_loop()

    async def settled() -> bool:
        replicas: list[dict[str, Any]] = await fe.admin_ok("get_replicas", {})
        current = {m: vs[0] for m, vs in (await current_versions(fe)).items() if vs}
        key = sorted(
            (r["model_name"], r["model_version"], r["replica_id"], r["pid"], r["draining"])
            for r in replicas
        )
        seen[:] = [key, current]
        if key != state["key"]:
            state.update(key=key, since=loop.time(), replicas=replicas)
            return False
        serving = [
            r for r in replicas
            if r["model_name"] == MODEL and r["model_version"] == current.get(MODEL)
        ]  # fmt: skip
        return len(serving) >= REPLICAS and loop.time() - state["since"] >= 1.5

    try:
        await wait_for(settled, limit_s=limit_s, interval=0.25, what="replicas to settle")
    except AssertionError as e:
        raise AssertionError(
            f"{e}: last replicas/current {seen!r}; frontend log ends with:\n{fe.log_tail()}"
        ) from None
    replicas: list[dict[str, Any]] = state["replicas"]
    return replicas


async def orphans_of(killed_pid: int) -> list[int]:
    """Replica processes of the killed frontend still alive ORPHAN_GRACE_S after the kill."""
    with contextlib.suppress(AssertionError):
        await wait_for(
            lambda: not container_pids(killed_pid), limit_s=ORPHAN_GRACE_S, interval=0.1,
            what="the killed frontend's replicas to exit",
        )  # fmt: skip
    return container_pids(killed_pid)


@pytest.mark.slow
@pytest.mark.parametrize("rounds", ROUND_PARAMS, indirect=True)
async def test_deploy_and_set_version_killed_mid_call_leave_no_orphans_and_retry_succeeds(
    frontend: FrontendProcess, rounds: int, seed: int, tmp_path: Path
) -> None:
    """Even rounds deploy a new version (2 replicas), odd rounds switch to another registered
    version; the frontend is SIGKILLed 0-1.5 s after the call is sent, then restarted. After the
    replicas settle: no connected replica of a non-current version, no live replica process of the
    killed frontend, the killed deploy's version absent or current, and the same deploy_model
    call retried answers 200 and leaves that version current."""
    rng = random.Random(seed)
    violations: list[str] = []
    orphan_processes = stray_replicas = 0
    artifacts: dict[str, str] = {}

    def artifact(version: str) -> str:
        if version not in artifacts:
            artifacts[version] = write_artifact(tmp_path, version)
        return artifacts[version]

    await frontend.start()
    await frontend.admin_ok("deploy_model", deploy_doc(artifact("1"), "1"), limit_s=120)
    next_version = 2
    for r in range(rounds):
        versions = (await current_versions(frontend)).get(MODEL, [])
        before = versions[0] if versions else None
        if r % 2 == 0 or len(versions) < 2:
            target = str(next_version)
            next_version += 1
            route, doc = "deploy_model", deploy_doc(artifact(target), target)
        else:
            target = rng.choice([v for v in versions if v != before])
            route, doc = "set_model_version", {"model_name": MODEL, "model_version": target}
        task = asyncio.ensure_future(frontend.admin(route, doc, limit_s=120))
        delay = rng.uniform(0.0, 1.5)
        await asyncio.sleep(delay)
        killed = frontend.kill()
        answer = (await asyncio.gather(task, return_exceptions=True))[0]
        acked = isinstance(answer, Response) and answer.status == 200
        outcome = "acked" if acked else "no answer"
        where = f"round {r}: {route} {target} killed after {delay:.2f} s ({outcome})"

        def fail(problem: str, where: str = where) -> None:
            violations.append(f"{where}: {problem}")

        if isinstance(answer, Response) and not acked:
            fail(f"answered {answer.status} before the kill: {answer.body[:300]!r}")

        await frontend.start()
        left = await orphans_of(killed)
        if left:
            orphan_processes += len(left)
            fail(f"{len(left)} replica processes of the killed frontend (pid {killed}) alive "
                 f"{ORPHAN_GRACE_S:.0f} s after the kill: pids {left}")  # fmt: skip
            for pid in left:  # ours to stop, so that the next rounds start clean
                if live(pid):
                    os.kill(pid, signal.SIGKILL)
        replicas = await settled_replicas(frontend)
        versions = (await current_versions(frontend)).get(MODEL, [])
        current = versions[0] if versions else None
        stray = [x for x in replicas if x["model_name"] != MODEL or x["model_version"] != current]
        if stray:
            stray_replicas += len(stray)
            fail(f"current version {current}, yet replicas of other versions are connected: "
                 f"{[(x['model_version'], x['replica_id'], x['pid']) for x in stray]}")  # fmt: skip
        if acked and current != target:
            fail(f"the call was acknowledged, yet the current version is {current}")
        if route == "set_model_version":
            if current not in (before, target):
                fail(f"current version {current}, expected {before} or {target}")
            continue
        if target in versions and current != target:
            fail(f"version {target} is registered but not current (current {current}, "
                 f"registered {versions})")  # fmt: skip
        retry = await frontend.admin(route, doc, limit_s=120)
        if retry.status != 200:
            fail(f"retrying the same deploy_model answered {retry.status}: {retry.body[:300]!r}")
            continue
        now = (await current_versions(frontend)).get(MODEL, [])
        if now[:1] != [target]:
            fail(f"the retried deploy answered 200, yet the current version is {now[:1]}")

    assert not violations, (
        f"{len(violations)} violations over {rounds} rounds: {orphan_processes} orphan replica "
        f"processes, {stray_replicas} connected replicas of non-current versions "
        f"(CLIPPER_KILL_SEED={seed}):\n  " + "\n  ".join(violations)
    )
