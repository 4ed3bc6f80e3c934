"""The Kubernetes manifests: names, secrets, settings errors, the render command, and — where
``kubernetes-validate`` is installed (``.ci/run``'s Kubernetes environment, ``-m k8s``) — a
strict schema check of everything rendered, and of a broken manifest that must fail it."""

from __future__ import annotations

import copy
import importlib.util
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from clipper.cli import main
from clipper.errors import ConfigError
from clipper.kube.manifests import (
    CLIENT_KEYS_SECRET,
    SERVER_KEYS_SECRET,
    KubeSettings,
    ReplicaSpec,
    dns_label,
    frontend_objects,
    replica_deployment,
    replica_deployment_name,
)
from clipper.kube.render import read_keys

HAS_VALIDATE = importlib.util.find_spec("kubernetes_validate") is not None
K8S_VERSION = "1.37.0"


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return read_keys(tmp_path_factory.mktemp("keys"))


def replica(**kw: Any) -> ReplicaSpec:
    spec: dict[str, Any] = {
        "frontend": "clipper-frontend-0",
        "frontend_host": "clipper-frontend-0.clipper-frontend.ns.svc.cluster.local",
        "frontend_port": 7000,
        "model": "digits",
        "version": "1",
        "input_type": "doubles",
        "replicas": 2,
    }
    return ReplicaSpec(**(spec | kw))


def by_kind(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def test_names_are_dns_labels_stable_and_distinct() -> None:
    assert dns_label("digits") == "digits"
    long = dns_label("clipper", "fe-0", "A_Model.Name" * 10, "v1")
    assert len(long) <= 63 and long == long.lower() and long[-9] == "-"
    assert long == dns_label("clipper", "fe-0", "A_Model.Name" * 10, "v1")
    # Names that sanitise alike still differ: the hash is of the exact names.
    assert dns_label("m", "A.b") != dns_label("m", "a-b")
    name = replica_deployment_name("clipper-frontend-0", "digits", "1")
    assert name == replica_deployment_name("clipper-frontend-0", "digits", "1")
    assert name != replica_deployment_name("clipper-frontend-1", "digits", "1")
    assert len(replica_deployment_name("f" * 60, "m" * 120, "v" * 120)) <= 53


def test_a_replica_deployment_dials_its_frontend_with_the_replica_key() -> None:
    s = KubeSettings(namespace="ns", image="reg/clipper:1", replica_gpus=1)
    dep = replica_deployment(s, replica())
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    [c] = pod["containers"]
    args = c["args"]
    assert args[args.index("--ip") + 1] == replica().frontend_host
    assert "--fetch-artifact" in args  # never the frontend's disk
    assert args[args.index("--replica-token") + 1] == "$(POD_NAME)"
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    [keys] = [v for v in pod["volumes"] if v["name"] == "rpc-keys"]
    assert keys["secret"]["secretName"] == CLIENT_KEYS_SECRET
    assert keys["secret"]["defaultMode"] == 0o400
    assert pod["terminationGracePeriodSeconds"] > s.drain_timeout_s
    assert dep["metadata"]["annotations"]["clipper-serve/model-name"] == "digits"
    # Without RPC auth there is no key to mount.
    open_dep = replica_deployment(s, replica(auth=False))
    assert "--rpc-keys" not in open_dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert all(v["name"] != "rpc-keys" for v in open_dep["spec"]["template"]["spec"]["volumes"])


def test_replica_pods_never_hold_the_frontends_secret_key(keys: dict[str, str]) -> None:
    objs = by_kind(frontend_objects(KubeSettings(), keys))
    replica_secret = objs[("Secret", CLIENT_KEYS_SECRET)]["stringData"]
    assert set(replica_secret) == {"server.key", "client.key_secret"}
    frontend_secret = objs[("Secret", SERVER_KEYS_SECRET)]["stringData"]
    assert set(frontend_secret) == {"server.key", "server.key_secret", "client.key"}


def test_a_stopping_frontend_pod_has_the_time_to_drain(keys: dict[str, str]) -> None:
    from clipper.config import FrontendConfig

    objs = by_kind(frontend_objects(KubeSettings(), keys))
    data = objs[("ConfigMap", "clipper-config")]["data"]
    drain = float(data["CLIPPER_DRAIN_TIMEOUT_S"])
    assert drain == FrontendConfig().drain_timeout_s
    # Not ready but still accepting while the Service's endpoints drop the pod.
    delay = float(data["CLIPPER_DRAIN_DELAY_S"])
    assert delay >= 5
    pod = objs[("StatefulSet", "clipper-frontend")]["spec"]["template"]["spec"]
    # The delay, the drain, then the replicas' stop, before Kubernetes' SIGKILL.
    assert pod["terminationGracePeriodSeconds"] >= delay + drain + 5
    # A failing model keeps no frontend out of the Service: every frontend serves it alike.
    [frontend] = pod["containers"]
    assert frontend["readinessProbe"]["httpGet"]["path"] == "/ready?ignore=model_errors"


def test_frontends_get_stable_identities_and_the_rbac_their_manager_needs(
    keys: dict[str, str],
) -> None:
    s = KubeSettings(namespace="prod", frontends=3, store="redis://redis:6379/0")
    objs = by_kind(frontend_objects(s, keys))
    sts = objs[("StatefulSet", "clipper-frontend")]
    assert sts["spec"]["replicas"] == 3
    assert objs[("Service", "clipper-frontend")]["spec"]["clusterIP"] == "None"
    env = {e["name"]: e for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["CLIPPER_NODE_ID"]["value"] == "$(POD_NAME)"
    assert env["CLIPPER_ADVERTISE_HOST"]["value"].startswith("$(POD_NAME).clipper-frontend.prod")
    config = objs[("ConfigMap", "clipper-config")]["data"]
    assert config["CLIPPER_STORE"] == "redis://redis:6379/0"
    assert config["CLIPPER_MANAGER"].startswith("k8s://prod?")
    verbs = {
        (g, r): rule["verbs"]
        for rule in objs[("Role", "clipper-frontend")]["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert {"create", "patch", "delete"} <= set(verbs[("apps", "deployments")])
    assert "patch" in verbs[("", "pods")]  # the pod-deletion-cost of drained pods


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"frontends": 2}, "need a shared store"),
        ({"namespace": "Not_A_Label"}, "DNS-1123"),
        ({"frontends": 0}, "frontends must be >= 1"),
        ({"replica_gpus": -1}, "GPUs must be >= 0"),
    ],
)
def test_bad_settings_are_refused_with_the_reason(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        KubeSettings(**kw)


def test_render_writes_a_private_multi_document_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "clipper.yaml"
    rc = main(
        ["k8s", "render", "--namespace", "demo", "--keys-dir", str(tmp_path / "k"), "-o", str(out)]
    )
    assert rc == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600  # secret keys inside
    docs = list(yaml.safe_load_all(out.read_text()))
    assert [d["kind"] for d in docs][-1] == "StatefulSet"
    assert all(d["metadata"]["namespace"] == "demo" for d in docs)
    # The keys it wrote are the ones in the key directory: frontends started from it agree.
    secret = next(d for d in docs if d["metadata"]["name"] == SERVER_KEYS_SECRET)
    assert secret["stringData"]["server.key"] == (tmp_path / "k" / "server.key").read_text()
    rc = main(["k8s", "render", "--frontends", "2"])
    assert rc == 2
    assert "need a shared store" in capsys.readouterr().err


# -- strict schema validation (kubernetes-validate) ----------------------------------------------

needs_validate = pytest.mark.skipif(
    not HAS_VALIDATE, reason="kubernetes-validate is not installed (.ci/run's k8s environment)"
)


def validate(obj: dict[str, Any]) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def everything(keys: dict[str, str]) -> list[dict[str, Any]]:
    s = KubeSettings(namespace="prod", frontends=2, store="redis://redis:6379/0", replica_gpus=1)
    return [
        *frontend_objects(s, keys),
        *frontend_objects(KubeSettings(), keys),
        replica_deployment(s, replica()),
        replica_deployment(s, replica(auth=False, model="x" * 120, version="2024-01-01")),
    ]


@pytest.mark.k8s
@needs_validate
def test_every_rendered_object_passes_strict_validation(keys: dict[str, str]) -> None:
    for obj in everything(keys):
        validate(obj)


@pytest.mark.k8s
@needs_validate
@pytest.mark.parametrize(
    "breakage",
    ["unknown field", "wrong type", "missing selector"],
)
def test_a_broken_manifest_fails_validation(breakage: str) -> None:
    import kubernetes_validate

    dep = copy.deepcopy(replica_deployment(KubeSettings(), replica()))
    if breakage == "unknown field":
        dep["spec"]["replica"] = 2  # a typo strict mode must catch
    elif breakage == "wrong type":
        dep["spec"]["replicas"] = "two"
    else:
        del dep["spec"]["selector"]
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(dep)
