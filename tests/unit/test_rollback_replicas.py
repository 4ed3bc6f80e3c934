"""A rollback restores the old version with its own replica count (the registry keeps each
version's count), not the count the current version runs; a version recorded with none takes
the current version's count."""

from __future__ import annotations

import asyncio

from tests.unit.test_runtime import connect, runtime, settle, until, version


async def test_a_rollback_restores_the_old_versions_own_replica_count() -> None:
    rt = await runtime()
    for v, n in (("1", 3), ("2", 1)):
        deploy = asyncio.create_task(rt.control.deploy(version(v, n=n)))
        await until(lambda: "m" in rt.registry.intents, "the intent")
        await settle(rt)
        connect(rt, v, n)
        await deploy
    await rt.control.scale("m", 4, "2", wait=False)
    await settle(rt)
    assert rt.manager.running == {("m", "2"): 4}
    connect(rt, "1", 0)
    switch = asyncio.create_task(rt.control.set_version("m", "1"))
    await until(lambda: "m" in rt.registry.intents, "the intent")
    await settle(rt)
    assert rt.manager.running[("m", "1")] == 3  # its own three, not version 2's four
    connect(rt, "1", 3)
    await switch
    await settle(rt)
    assert rt.manager.running == {("m", "1"): 3}
    assert rt.registry.models["m"]["2"].num_replicas == 4  # kept for rolling forward again


async def test_a_version_recorded_with_no_replicas_takes_the_current_count() -> None:
    rt = await runtime()
    deploy = asyncio.create_task(rt.control.deploy(version("1", n=2)))
    await until(lambda: "m" in rt.registry.intents, "the intent")
    await settle(rt)
    connect(rt, "1", 2)
    await deploy
    added = asyncio.create_task(rt.control.deploy(version("2", n=0), set_current=False))
    await added
    switch = asyncio.create_task(rt.control.set_version("m", "2"))
    await until(lambda: "m" in rt.registry.intents, "the intent")
    await settle(rt)
    assert rt.manager.running[("m", "2")] == 2
    connect(rt, "2", 2)
    await switch
    assert rt.registry.models["m"]["2"].num_replicas == 2
