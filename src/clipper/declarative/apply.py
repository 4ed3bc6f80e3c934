"""Running a :class:`~clipper.declarative.plan.Plan` through the admin API.

Before the first call every artifact to deploy is made ready: a directory is uploaded as it
is; a file is loaded and packaged as ``clipper model deploy`` does (framework detected), and
the frontend is told the file's digest so that the next apply recognises it. A step the
frontend refuses stops the run; the steps before it stay done, and applying the file again
carries on from there (each step is idempotent, and the plan is made afresh).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clipper.artifact_digest import content_digest
from clipper.client import Client
from clipper.declarative.plan import Plan, Step
from clipper.declarative.spec import VersionSpec
from clipper.errors import ClipperError, ConfigError, RegistryError, RequestError

__all__ = ["ApplyError", "Prepared", "execute", "prepared_artifacts"]


class ApplyError(RegistryError):
    """A step the frontend refused; ``done`` steps before it were applied."""

    def __init__(self, step: Step, done: int, total: int, cause: Exception) -> None:
        super().__init__(
            f"{step.sign} {step.text}: refused: {cause}\n"
            f"{done} of {total} changes were applied before it; fix the file and apply it "
            "again (what is done already is not repeated)"
        )
        self.cause = cause


@dataclass(frozen=True, slots=True)
class Prepared:
    """What to upload for a version: a directory, and the digest of the file it came from."""

    path: Path
    source_sha256: str


@contextmanager
def prepared_artifacts(plan: Plan) -> Iterator[dict[tuple[str, str], Prepared]]:
    """Package every artifact the plan deploys, in a temporary directory removed afterwards;
    :class:`ConfigError` names the file that cannot be loaded."""
    with tempfile.TemporaryDirectory(prefix="clipper-apply-") as tmp:
        out: dict[tuple[str, str], Prepared] = {}
        for step in plan.steps:
            spec: VersionSpec | None = step.args.get("spec")
            if step.op != "deploy" or spec is None or spec.artifact is None:
                continue
            ready = _prepare(spec.artifact, Path(tmp) / spec.model / spec.version)
            if spec.source_sha256 is not None:  # made from a file named elsewhere: keep its name
                ready = Prepared(ready.path, spec.source_sha256)
            out[(spec.model, spec.version)] = ready
        yield out


def _prepare(path: Path, dest: Path) -> Prepared:
    digest = content_digest(path)
    if path.is_dir():
        return Prepared(path, digest)
    from clipper.deployers import package
    from clipper.deployers.files import read_model_file

    try:
        found = read_model_file(path)  # by content, as `clipper model deploy` reads it
        package(found.model, dest, framework=found.framework)
    except ClipperError as e:
        raise ConfigError(f"{path}: {e}") from None
    except Exception as e:  # unpickling runs the file's code: anything can go wrong in it
        raise ConfigError(f"{path}: cannot load the model: {type(e).__name__}: {e}") from None
    return Prepared(dest, digest)


def execute(
    plan: Plan,
    client: Client,
    prepared: dict[tuple[str, str], Prepared],
    echo: Callable[[str], None],
) -> int:
    """Run the steps in order, echoing each once done; the number run."""
    total = len(plan.steps)
    for done, step in enumerate(plan.steps):
        try:
            _run(step, client, prepared)
        except (RegistryError, RequestError, ConfigError) as e:
            raise ApplyError(step, done, total, e) from None
        except ClipperError as e:  # unreachable, or the store could not take it: retry
            raise ClipperError(str(ApplyError(step, done, total, e))) from None
        echo(f"{step.sign} {step.text}: done")
    return total


def _run(step: Step, client: Client, prepared: dict[tuple[str, str], Prepared]) -> None:
    a = step.args
    if step.op == "add_app":
        record: dict[str, Any] = dict(a["record"])
        client.register_application(
            record.pop("name"), record.pop("input_type"), record.pop("default_output"),
            record.pop("latency_slo_micros"), **record,
        )  # fmt: skip
    elif step.op == "update_app":
        client.update_application(a["name"], **a["changes"])
    elif step.op == "delete_app":
        client.delete_application(a["name"])
    elif step.op == "deploy":
        _deploy(a["spec"], client, prepared)
    elif step.op == "scale":
        client.set_num_replicas(a["name"], a["replicas"], a["version"])
    elif step.op == "set_version":
        client.set_model_version(a["name"], a["version"])
    elif step.op == "delete_version":
        client.delete_model_version(a["name"], a["version"])
    elif step.op == "autoscale":
        client.set_autoscale(a["name"], a["version"], **a["settings"])
    elif step.op == "split":
        client.set_traffic_split(a["name"], a["weights"], sticky=a["sticky"])
    elif step.op == "shadow":
        client.set_shadow(a["name"], a["version"], a["share"])
    elif step.op == "link":
        client.link_model_to_app(a["app"], a["model"])
    elif step.op == "unlink":
        client.unlink_model_from_app(a["app"], a["model"])
    elif step.op == "add_tenant":
        client.add_tenant(a["name"], priority=a["priority"], quotas=a["quotas"])
    elif step.op == "update_tenant":
        client.update_tenant(a["name"], **{k: v for k, v in a.items() if k != "name"})
    elif step.op == "delete_tenant":
        client.delete_tenant(a["name"])
    else:  # pragma: no cover - the planner makes only the ops above
        raise ClipperError(f"unknown step {step.op}")


def _deploy(v: VersionSpec, client: Client, prepared: dict[tuple[str, str], Prepared]) -> None:
    if v.artifact is None:
        fixed = v.batching.controller == "fixed" and v.batching.max_batch_size is not None
        client.admin(
            "add_model",
            {
                "model_name": v.model,
                "model_version": v.version,
                "input_type": v.input_type.readable,
                "labels": list(v.labels),
                "container_name": v.container_name,
                "batch_size": v.batching.max_batch_size if fixed else -1,
            },
        )
        return
    p = prepared[(v.model, v.version)]
    client.deploy_model(
        v.model, v.version, artifact=p.path, input_type=v.input_type.readable,
        num_replicas=v.replicas, batching=v.batching, source_sha256=p.source_sha256,
        labels=v.labels, pooled=v.pooled,
    )  # fmt: skip
