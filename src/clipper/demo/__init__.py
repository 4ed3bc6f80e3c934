"""Demo applications for ``clipper start --demo``."""

from __future__ import annotations

import asyncio
from typing import Any

from clipper.demo.models import Stats, train_digits
from clipper.server import Clipper

__all__ = ["deploy_demo"]


async def deploy_demo(clipper: Clipper) -> list[str]:
    """``demo`` (any list of numbers -> its statistics), and ``digits`` (scikit-learn logistic
    regression on the 8x8 digits data set) when scikit-learn is installed."""
    lines: list[str] = []
    registry = clipper.registry
    if "demo" not in registry.apps:  # a persistent store may have it from an earlier run
        await clipper.register_application("demo", "doubles", '{"sum": null}', 100_000)
        await clipper.deploy_model("stats", "1", Stats(), input_type="doubles")
        await clipper.link_model_to_app("demo", "stats")
    base = clipper.query_url
    lines.append(f"demo app: curl -X POST {base}/demo/predict -d '{{\"input\": [1, 2, 3.5]}}'")
    # Trained on a worker thread: the event loop keeps serving (and hearing the stats
    # replica's heartbeats) during the seconds a fit takes.
    model: Any = None if "digits" in registry.apps else await asyncio.to_thread(train_digits)
    if model is not None:
        await clipper.register_application("digits", "doubles", "-1", 20_000)
        await clipper.deploy_model("logreg", "1", model, input_type="doubles")
        await clipper.link_model_to_app("digits", "logreg")
    if "digits" in registry.apps:
        lines.append(f"digits app: POST {base}/digits/predict with 64 pixel values (0-16)")
    for model in ("stats", "logreg"):  # restored from the store: wait for their replicas too
        version = registry.current.get(model)
        if version is not None:
            mv = registry.models[model][version]
            await clipper.wait_for_replicas(model, version, mv.num_replicas)
    return lines
