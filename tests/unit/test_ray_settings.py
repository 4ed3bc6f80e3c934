"""The ray:// manager's settings: its URL and a version's ray: labels, checked without Ray."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from clipper.clock import MonotonicClock
from clipper.errors import ConfigError
from clipper.inputs import InputType
from clipper.managers.base import ManagerContext, open_manager
from clipper.managers.ray_settings import Placement, parse_ray_url, version_placement
from clipper.registry import ModelVersion


def version(*labels: str) -> ModelVersion:
    return ModelVersion(name="m", version="1", input_type=InputType.DOUBLES, labels=labels)


def test_the_url_gives_address_namespace_and_default_placement() -> None:
    s = parse_ray_url("10.0.0.5:6379?namespace=prod&num_cpus=2&num_gpus=0.25&resource.accel=1")
    assert s.address == "10.0.0.5:6379" and s.namespace == "prod"
    assert s.placement == Placement(num_cpus=2, num_gpus=0.25, resources=(("accel", 1.0),))
    assert s.placement.options() == {"num_cpus": 2, "num_gpus": 0.25, "resources": {"accel": 1}}
    bare = parse_ray_url("")
    assert bare.address == "auto" and bare.namespace == "clipper"
    assert bare.placement == Placement() and bare.poll_s == 1.0


@pytest.mark.parametrize(
    ("rest", "match"),
    [
        ("auto?colour=red", r"unknown parameter 'colour'; expected one of namespace"),
        ("auto?num_cpus=many", r"ray num_cpus must be a number, got 'many'"),
        ("auto?num_gpus=-1", r"ray num_gpus must be >= 0"),
        ("auto?strategy=pack", r"strategy must be default or spread"),
        ("auto?num_cpus", r"bad parameters"),
        ("auto?max_per_node=0", r"ray max_per_node must be a whole number >= 1, got '0'"),
        ("auto?max_per_node=1.5", r"ray max_per_node must be a whole number >= 1"),
        ("auto?settle_s=soon", r"ray settle_s must be a number, got 'soon'"),
    ],
)
def test_a_bad_url_says_what_is_wrong(rest: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_ray_url(rest)


def test_a_versions_labels_override_the_url_placement() -> None:
    base = parse_ray_url("auto?num_cpus=2&resource.accel=1").placement
    p = version_placement(
        base, version("team-a", "ray:num_gpus=0.5", "ray:resource:accel=2", "ray:strategy=spread")
    )
    assert p == Placement(num_cpus=2, num_gpus=0.5, resources=(("accel", 2.0),), strategy="spread")
    assert p.options()["scheduling_strategy"] == "SPREAD"
    assert version_placement(base, version("plain")) == base
    with pytest.raises(ConfigError, match=r"label 'ray:cpus=2' is not ray:num_cpus=N"):
        version_placement(base, version("ray:cpus=2"))


def test_the_per_node_limit_and_the_settle_time_from_the_url_and_labels() -> None:
    s = parse_ray_url("auto?max_per_node=2&settle_s=3")
    assert s.placement.max_per_node == 2 and s.settle_s == 3.0
    bare = parse_ray_url("auto")
    assert bare.placement.max_per_node is None and bare.settle_s == 10.0
    p = version_placement(bare.placement, version("ray:max_per_node=1", "ray:num_gpus=0.5"))
    assert p.max_per_node == 1 and p.demand() == {"CPU": 1.0, "GPU": 0.5}
    assert version_placement(s.placement, version("plain")).max_per_node == 2
    with pytest.raises(ConfigError, match=r"ray max_per_node must be a whole number"):
        version_placement(bare.placement, version("ray:max_per_node=none"))
    assert Placement(num_cpus=0, resources=(("accel", 1.0),)).demand() == {"accel": 1.0}


def test_without_ray_the_manager_says_how_to_install_it(tmp_path: Path) -> None:
    if importlib.util.find_spec("ray") is not None:
        pytest.skip("Ray is installed here")
    ctx = ManagerContext(
        rpc_host=lambda: "127.0.0.1", rpc_port=lambda: 7000, state_dir=tmp_path,
        clock=MonotonicClock(), heartbeat_interval_s=1.0, python=None, on_exit=None,
        drain=None, nice=0,
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"needs Ray: pip install 'clipper-serve\[ray\]'"):
        open_manager("ray://auto?namespace=x", ctx)
