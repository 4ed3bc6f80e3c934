"""The Kubernetes manifests: names, secrets (kept across re-renders), settings errors, the
render command, the Pod Security "restricted" rules on every pod, and — where
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
    ADMIN_CLIENT_LABEL,
    ADMIN_TOKEN_SECRET,
    CLIENT_KEYS_SECRET,
    SERVER_KEYS_SECRET,
    KubeSettings,
    ReplicaSpec,
    dns_label,
    frontend_addresses,
    frontend_objects,
    replica_budget,
    replica_deployment,
    replica_deployment_name,
)
from clipper.kube.render import read_admin_token, read_keys

HAS_VALIDATE = importlib.util.find_spec("kubernetes_validate") is not None
K8S_VERSION = "1.37.0"
FE0 = "tcp://clipper-frontend-0.clipper-frontend.ns.svc.cluster.local:7000"
FE1 = "tcp://clipper-frontend-1.clipper-frontend.ns.svc.cluster.local:7000"
SHARED: dict[str, Any] = {"store": "redis://redis:6379/0", "artifacts_storage_class": "nfs-client"}


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return read_keys(tmp_path_factory.mktemp("keys"))


def replica(**kw: Any) -> ReplicaSpec:
    spec: dict[str, Any] = {
        "frontends": (FE0,),
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
    # One name per model version for the whole deployment: no frontend in it.
    name = replica_deployment_name("digits", "1")
    assert name == "clipper-digits-1" == replica_deployment_name("digits", "1")
    assert name != replica_deployment_name("digits", "2")
    # A '-' in a model name cannot make two versions share a name.
    assert replica_deployment_name("a-b", "c") != replica_deployment_name("a", "b-c")
    assert len(replica_deployment_name("m" * 120, "v" * 120)) <= 53
    assert len(replica_deployment_name("m-" * 60, "v" * 120)) <= 53


def test_a_replica_deployment_dials_every_frontend_with_the_replica_key() -> None:
    s = KubeSettings(namespace="ns", image="reg/clipper:1", replica_gpus=1)
    dep = replica_deployment(s, replica(frontends=(FE0, FE1)))
    assert dep["metadata"]["name"] == "clipper-digits-1"
    assert "clipper-serve/frontend" not in dep["metadata"]["labels"]
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    [c] = pod["containers"]
    args = c["args"]
    # The first frontend by flags (an older container serves it), the others and shared mode
    # by environment (an older container ignores them rather than refusing a flag).
    assert (
        args[args.index("--ip") + 1] == "clipper-frontend-0.clipper-frontend.ns.svc.cluster.local"
    )
    assert args[args.index("--port") + 1] == "7000"
    assert "--frontend" not in args and "--shared" not in args and "--parent-pid" not in args
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["CLIPPER_FRONTENDS"] == FE1
    assert env["CLIPPER_SHARED"] == "1"
    # Longer than the kubelet's restart back-off takes to reset (10 minutes of running).
    assert float(env["CLIPPER_ORPHAN_TIMEOUT_S"]) > 600
    # One frontend: nothing beyond --ip/--port to dial.
    one = replica_deployment(s, replica())["spec"]["template"]["spec"]["containers"][0]
    assert "CLIPPER_FRONTENDS" not in {e["name"] for e in one["env"]}
    assert "--fetch-artifact" in args  # never the frontend's disk
    assert args[args.index("--replica-token") + 1] == "$(POD_NAME)"
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
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
    from clipper.managers.kubernetes import parse_url

    s = KubeSettings(namespace="prod", frontends=3, **SHARED)
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
    # The manager it configures dials all 3 frontends, by the names they advertise (a replica
    # told the addresses by a frontend has a link to each already).
    settings, _ = parse_url(config["CLIPPER_MANAGER"].removeprefix("k8s://"))
    assert settings.frontend_pods == 3
    advertised = [
        env["CLIPPER_ADVERTISE_HOST"]["value"].replace("$(POD_NAME)", f"clipper-frontend-{i}")
        for i in range(3)
    ]
    rpc_port = int(config["CLIPPER_RPC_PORT"])
    assert frontend_addresses(settings, 3, rpc_port) == tuple(
        f"tcp://{host}:{rpc_port}" for host in advertised
    )
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
        ({"frontends": 2, "store": "redis://r:6379/0"}, "ReadWriteMany"),
        ({"namespace": "Not_A_Label"}, "DNS-1123"),
        ({"frontends": 0}, "frontends must be >= 1"),
        ({"replica_gpus": -1}, "GPUs must be >= 0"),
        ({"run_as_user": 0}, "non-root uid"),
        ({"admin_namespace": "Ops_Team"}, "admin namespace"),
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
    )  # fmt: skip
    assert rc == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600  # secret keys inside
    docs = list(yaml.safe_load_all(out.read_text()))
    kinds = [d["kind"] for d in docs]
    # Apply order: what the frontend pods mount exists before the StatefulSet that makes them.
    assert kinds.index("StatefulSet") > max(kinds.index("Secret"), kinds.index("ConfigMap"))
    assert all(d["metadata"]["namespace"] == "demo" for d in docs)
    # The keys it wrote are the ones in the key directory: frontends started from it agree.
    secret = next(d for d in docs if d["metadata"]["name"] == SERVER_KEYS_SECRET)
    assert secret["stringData"]["server.key"] == (tmp_path / "k" / "server.key").read_text()
    rc = main(["k8s", "render", "--frontends", "2", "--keep-secrets"])
    assert rc == 2
    assert "need a shared store" in capsys.readouterr().err


def test_a_re_render_never_rotates_the_secrets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def render(*extra: str) -> tuple[int, list[dict[str, Any]]]:
        out = tmp_path / "out.yaml"
        out.unlink(missing_ok=True)
        rc = main(["k8s", "render", *extra, "-o", str(out)])
        return rc, list(yaml.safe_load_all(out.read_text())) if out.exists() else []

    def secrets(docs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
        return {d["metadata"]["name"]: d["stringData"] for d in docs if d["kind"] == "Secret"}

    keys = str(tmp_path / "keys")
    rc, first = render("--keys-dir", keys)
    assert rc == 0
    assert set(secrets(first)) == {SERVER_KEYS_SECRET, CLIENT_KEYS_SECRET, ADMIN_TOKEN_SECRET}
    # The same key directory: the same Secrets, byte for byte (kubectl apply changes nothing).
    rc, again = render("--keys-dir", keys, "--frontend-cpu", "2")
    assert rc == 0 and secrets(again) == secrets(first)
    assert secrets(first)[ADMIN_TOKEN_SECRET]["token"] == read_admin_token(Path(keys))
    assert stat.S_IMODE((Path(keys) / "admin.token").stat().st_mode) == 0o600
    # Without it: no Secrets at all (the cluster's stay), everything else as before.
    rc, kept = render("--keep-secrets")
    assert rc == 0 and secrets(kept) == {}
    assert [d["kind"] for d in kept] == [d["kind"] for d in first if d["kind"] != "Secret"]
    # With neither, the render refuses: fresh keys would cut replicas off their frontends.
    rc, none = render()
    assert rc == 2 and none == []
    assert "--keys-dir DIR" in capsys.readouterr().err


def test_the_admin_service_reaches_a_token_guarded_admin_api(keys: dict[str, str]) -> None:
    from clipper.config import FrontendConfig

    objs = by_kind(frontend_objects(KubeSettings(), keys, "t" * 32))
    data = objs[("ConfigMap", "clipper-config")]["data"]
    [c] = objs[("StatefulSet", "clipper-frontend")]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    ref = env["CLIPPER_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": ADMIN_TOKEN_SECRET, "key": "token"}
    assert objs[("Secret", ADMIN_TOKEN_SECRET)]["stringData"]["token"] == "t" * 32
    # The settings the pod gets are ones a frontend accepts (beyond loopback needs the token).
    config = FrontendConfig(admin_host=data["CLIPPER_ADMIN_HOST"], admin_token="t" * 32)
    assert config.admin_host == "0.0.0.0"
    with pytest.raises(ConfigError, match="admin token"):
        FrontendConfig(admin_host=data["CLIPPER_ADMIN_HOST"])
    svc = objs[("Service", "clipper-admin")]["spec"]
    assert svc["ports"][0]["targetPort"] == "admin"


def test_frontend_resources_default_to_burstable_and_follow_the_flags(
    tmp_path: Path,
) -> None:
    def resources(*flags: str) -> dict[str, Any]:
        out = tmp_path / "r.yaml"
        assert main(["k8s", "render", "--keep-secrets", *flags, "-o", str(out)]) == 0
        sts = next(d for d in yaml.safe_load_all(out.read_text()) if d["kind"] == "StatefulSet")
        found: dict[str, Any] = sts["spec"]["template"]["spec"]["containers"][0]["resources"]
        return found

    assert resources() == {
        "requests": {"cpu": "1", "memory": "1Gi"},
        "limits": {"memory": "1Gi"},  # no CPU quota on the event loop
    }
    guaranteed = resources(
        "--frontend-cpu", "2", "--frontend-memory", "4Gi", "--frontend-cpu-limit", "2"
    )
    assert guaranteed["requests"] == guaranteed["limits"] == {"cpu": "2", "memory": "4Gi"}


def test_budgets_and_network_policies(keys: dict[str, str]) -> None:
    s = KubeSettings(namespace="prod", admin_namespace="ops")
    objs = by_kind(frontend_objects(s, keys))
    sts = objs[("StatefulSet", "clipper-frontend")]
    pdb = objs[("PodDisruptionBudget", "clipper-frontend")]["spec"]
    assert pdb["maxUnavailable"] == 1
    assert pdb["selector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]

    fe = objs[("NetworkPolicy", "clipper-frontend")]["spec"]
    assert fe["podSelector"]["matchLabels"] == sts["spec"]["template"]["metadata"]["labels"]
    by_port = {p["port"]: rule.get("from") for rule in fe["ingress"] for p in rule["ports"]}
    assert by_port["query"] is None and by_port["grpc"] is None  # open
    dep = replica_deployment(s, replica())
    replica_labels = dep["spec"]["template"]["metadata"]["labels"]
    [rpc_from] = by_port["rpc"]
    assert rpc_from["podSelector"]["matchLabels"].items() <= replica_labels.items()
    [admin_from] = by_port["admin"]
    assert admin_from["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "ops"}
    assert admin_from["podSelector"]["matchLabels"] == {ADMIN_CLIENT_LABEL: "true"}
    assert set(by_port) == {"query", "grpc", "rpc", "admin"}  # every port named in a rule

    rp = objs[("NetworkPolicy", "clipper-replica")]["spec"]
    assert rp["podSelector"]["matchLabels"].items() <= replica_labels.items()
    [rule] = rp["ingress"]
    [source] = rule["from"]
    assert source["podSelector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]
    ports = {p["name"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert [p["port"] for p in rule["ports"]] == ["ready"] and ports == {"ready"}

    budget = replica_budget(s, dep)
    assert budget["metadata"]["name"] == dep["metadata"]["name"]
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"] == dep["spec"]["selector"]


# -- Pod Security "restricted" -----------------------------------------------------------------
# The fields the "restricted" profile checks (Kubernetes' Pod Security Standards), written out
# here rather than taken from the code under test.

_SAFE_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip
_BASELINE_FORBIDDEN = ("hostNetwork", "hostPID", "hostIPC")


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What in a pod spec the "restricted" Pod Security profile refuses (empty: it passes)."""
    bad: list[str] = []
    psc = pod.get("securityContext") or {}
    bad += [f"spec.{f}" for f in _BASELINE_FORBIDDEN if pod.get(f)]
    for v in pod.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= _SAFE_VOLUMES:
            bad.append(f"volume {v['name']}: {sorted(kinds)}")
    if psc.get("runAsUser") == 0:
        bad.append("spec.securityContext.runAsUser=0")
    containers = [*(pod.get("initContainers") or []), *pod["containers"]]
    for c in containers:
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("privileged"):
            bad.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{name}: allowPrivilegeEscalation must be false")
        if not (sc.get("runAsNonRoot") is True or psc.get("runAsNonRoot") is True):
            bad.append(f"{name}: runAsNonRoot must be true")
        if sc.get("runAsNonRoot") is False:
            bad.append(f"{name}: runAsNonRoot=false")
        if sc.get("runAsUser") == 0:
            bad.append(f"{name}: runAsUser=0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{name}: seccompProfile.type must be RuntimeDefault or Localhost")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            bad.append(f"{name}: capabilities must drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            bad.append(f"{name}: capabilities.add beyond NET_BIND_SERVICE")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            bad.append(f"{name}: hostPort")
        # Not required by "restricted", but asked of every clipper-serve pod.
        if sc.get("readOnlyRootFilesystem") is not True:
            bad.append(f"{name}: readOnlyRootFilesystem must be true")
    return bad


def pod_specs(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        o["spec"]["template"]["spec"]
        for o in objs
        if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")
    ]


def test_every_pod_passes_pod_security_restricted(keys: dict[str, str]) -> None:
    pods = pod_specs(everything(keys))
    assert len(pods) == 4  # two StatefulSets, two replica Deployments
    for pod in pods:
        assert restricted_violations(pod) == []
        # Read-only root: every writer has a volume (HOME on /tmp).
        for c in pod["containers"]:
            mounts = {m["mountPath"] for m in c["volumeMounts"]}
            env = {e["name"]: e.get("value") for e in c["env"]}
            assert "/tmp" in mounts and env["HOME"] == "/tmp"
    # The check catches what it should: each breakage alone is a violation.
    pod = copy.deepcopy(pods[0])
    sc = pod["containers"][0]["securityContext"]
    sc["allowPrivilegeEscalation"] = True
    sc["capabilities"] = {"add": ["SYS_ADMIN"]}
    del pod["securityContext"]["runAsNonRoot"], sc["runAsNonRoot"]
    del pod["securityContext"]["seccompProfile"], sc["seccompProfile"]
    pod["hostNetwork"] = True
    pod["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    assert len(restricted_violations(pod)) == 7


def test_the_frontend_can_read_its_secret_keys_as_its_non_root_user(
    keys: dict[str, str],
) -> None:
    """The key Secrets are mounted 0400 and the pod's fsGroup is the process's own group, so
    kubelet makes them root-owned 0440: what the key loaders accept from another owner."""
    s = KubeSettings(run_as_user=4242)
    sts = by_kind(frontend_objects(s, keys))[("StatefulSet", "clipper-frontend")]
    pod = sts["spec"]["template"]["spec"]
    psc = pod["securityContext"]
    assert psc["runAsUser"] == psc["runAsGroup"] == psc["fsGroup"] == 4242
    [vol] = [v for v in pod["volumes"] if v["name"] == "rpc-keys"]
    assert vol["secret"]["defaultMode"] == 0o400
    manager = by_kind(frontend_objects(s, keys))[("ConfigMap", "clipper-config")]["data"]
    assert "&uid=4242" in manager["CLIPPER_MANAGER"]  # the replicas run as the same user


# -- strict schema validation (kubernetes-validate) ----------------------------------------------

needs_validate = pytest.mark.skipif(
    not HAS_VALIDATE, reason="kubernetes-validate is not installed (.ci/run's k8s environment)"
)


def validate(obj: dict[str, Any]) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def everything(keys: dict[str, str]) -> list[dict[str, Any]]:
    s = KubeSettings(
        namespace="prod",
        frontends=2,
        **SHARED,
        replica_gpus=1,
        frontend_cpu_limit="1",
        admin_namespace="ops",
    )
    long = replica_deployment(s, replica(auth=False, model="x" * 120, version="2024-01-01"))
    return [
        *frontend_objects(s, keys, "a" * 43),
        *frontend_objects(KubeSettings(), None),
        replica_deployment(s, replica(frontends=(FE0, FE1))),
        long,
        replica_budget(s, long),
    ]


@pytest.mark.k8s
@needs_validate
def test_every_rendered_object_passes_strict_validation(keys: dict[str, str]) -> None:
    objs = everything(keys)
    kinds = {o["kind"] for o in objs}
    assert {
        "PodDisruptionBudget", "NetworkPolicy", "Secret", "StatefulSet", "PersistentVolumeClaim",
    } <= kinds  # fmt: skip
    for obj in objs:
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


def test_the_manager_url_carries_the_pods_user() -> None:
    from clipper.managers.kubernetes import parse_url

    settings, _ = parse_url("prod?image=reg/c:1&uid=4242")
    assert settings.run_as_user == 4242
    assert (
        replica_deployment(settings, replica())["spec"]["template"]["spec"]["securityContext"][
            "runAsUser"
        ]
        == 4242
    )
    assert parse_url("prod")[0].run_as_user == KubeSettings().run_as_user
    with pytest.raises(ConfigError, match="non-root uid"):
        parse_url("prod?uid=0")
    with pytest.raises(ConfigError, match="k8s://prod"):
        parse_url("prod?uid=nobody")


def test_many_frontends_share_one_read_write_many_artifacts_volume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each frontend's uploads/ and models/ are the same directories: a replica fetches its
    artifact from the first frontend whichever one it was uploaded to."""
    objs = by_kind(frontend_objects(KubeSettings(frontends=2, **SHARED), None))
    claim = objs[("PersistentVolumeClaim", "clipper-artifacts")]["spec"]
    assert claim["accessModes"] == ["ReadWriteMany"]
    assert claim["storageClassName"] == "nfs-client"
    pod = objs[("StatefulSet", "clipper-frontend")]["spec"]["template"]["spec"]
    [vol] = [v for v in pod["volumes"] if v["name"] == "artifacts"]
    assert vol["persistentVolumeClaim"]["claimName"] == "clipper-artifacts"
    [c] = pod["containers"]
    state = c["volumeMounts"][0]
    assert state["name"] == "state"
    shared = {m["mountPath"]: m["subPath"] for m in c["volumeMounts"] if m["name"] == "artifacts"}
    assert shared == {
        f"{state['mountPath']}/uploads": "uploads",
        f"{state['mountPath']}/models": "models",
    }
    # One frontend keeps them on its own state volume unless a class is given.
    single = by_kind(frontend_objects(KubeSettings(), None))
    assert not any(kind == "PersistentVolumeClaim" for kind, _ in single)
    # The render command: refused without the class, rendered with it.
    shared_store = ["k8s", "render", "--frontends", "2", "--store", "redis://r:6379/0"]
    assert main([*shared_store, "--keep-secrets"]) == 2
    assert "--artifacts-storage-class" in capsys.readouterr().err
    out = tmp_path / "m.yaml"
    rc = main([*shared_store, "--keep-secrets", "--artifacts-storage-class", "cephfs",
               "--artifacts-size", "50Gi", "-o", str(out)])  # fmt: skip
    assert rc == 0
    docs = list(yaml.safe_load_all(out.read_text()))
    [pvc] = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert pvc["spec"]["storageClassName"] == "cephfs"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "50Gi"
    kinds = [d["kind"] for d in docs]
    assert kinds.index("PersistentVolumeClaim") < kinds.index("StatefulSet")  # apply order


def test_the_manager_url_says_which_frontends_the_replicas_dial() -> None:
    from clipper.managers.kubernetes import parse_url

    settings, _ = parse_url("prod?frontends=3")
    assert (settings.frontend_pods, settings.dial) == (3, ())
    settings, _ = parse_url("prod?frontend=tcp://a:7001&frontend=tcp://b:7002,tcp://c:7003")
    assert settings.dial == ("tcp://a:7001", "tcp://b:7002", "tcp://c:7003")
    assert parse_url("prod")[0].dial == () and parse_url("prod")[0].frontend_pods == 0
    for bad, message in [
        ("prod?frontends=0", "frontends must be >= 1"),
        ("prod?frontends=two", "k8s://prod"),
        ("prod?frontends=2&frontend=tcp://a:1", "not both"),
        ("prod?frontend=a:7001", "tcp://HOST:PORT"),
        ("prod?frontend=tcp://a:http", "tcp://HOST:PORT"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_url(bad)
    with pytest.raises(ConfigError, match="at least one frontend"):
        replica(frontends=())
