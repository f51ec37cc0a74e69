"""Static checks of the Kubernetes manifests in deploy/kubernetes (kustomize base + overlays).

Offline, with no cluster: every rendered object is validated against the Kubernetes JSON
schemas that the ``kubernetes-validate`` package ships (strict: unknown fields fail), then the
contract is asserted on the objects: probes on our endpoints, GPU request, drain budget
consistent with ``MT_SHUTDOWN_GRACE_S``, HPA on the adapter's load metric with CPU fallback,
PDB and Service selecting the pods.

Rendering: the overlays use only two kustomize features, ``resources`` (files or
directories) and ``patches`` given by ``path`` (strategic merge patches found by kind and
name). ``render`` below implements exactly those, with the strategic-merge rules the patches
rely on: maps merge recursively, lists of maps merge by their merge key (``name`` for
containers, env, ports and volumes, ``key`` for tolerations), other lists are replaced. A
kustomization that uses anything else fails the test rather than rendering wrongly. Where a
``kubectl`` with kustomize is installed, the test also renders with it and requires the same
objects (so the small renderer cannot drift from kustomize unnoticed).
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("cpu", "gpu", "pulled-models")
KUBERNETES_VERSION = "1.30"  # oldest version we claim to support; schema of that release
SUPPORTED_KUSTOMIZE_FIELDS = {"apiVersion", "kind", "resources", "patches"}
MERGE_KEYS = {"tolerations": "key"}  # every other list of maps merges by "name"


# --- rendering ------------------------------------------------------------------------------


def _merge(base: Any, patch: Any, field: str = "") -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = _merge(base[key], value, key) if key in base else copy.deepcopy(value)
        return merged
    merge_key = MERGE_KEYS.get(field, "name")
    if (
        isinstance(base, list)
        and isinstance(patch, list)
        and all(isinstance(item, dict) and merge_key in item for item in base + patch)
    ):
        merged_list = [copy.deepcopy(item) for item in base]
        index = {item[merge_key]: position for position, item in enumerate(merged_list)}
        for item in patch:
            if item[merge_key] in index:
                position = index[item[merge_key]]
                merged_list[position] = _merge(merged_list[position], item, field)
            else:
                merged_list.append(copy.deepcopy(item))
        return merged_list
    return copy.deepcopy(patch)


def render(directory: Path) -> list[dict]:
    """The objects ``kustomize build directory`` gives, for the features listed above."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unsupported = set(kustomization) - SUPPORTED_KUSTOMIZE_FIELDS
    assert not unsupported, f"{directory}: kustomize fields the test cannot render: {unsupported}"
    objects: list[dict] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            objects += render(path)
        else:
            objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    for patch_entry in kustomization.get("patches", []):
        assert set(patch_entry) == {"path"}, f"only path patches are supported: {patch_entry}"
        patch = yaml.safe_load((directory / patch_entry["path"]).read_text())
        targets = [
            position
            for position, obj in enumerate(objects)
            if obj["kind"] == patch["kind"] and obj["metadata"]["name"] == patch["metadata"]["name"]
        ]
        assert len(targets) == 1, f"patch {patch_entry['path']} matches {len(targets)} objects"
        objects[targets[0]] = _merge(objects[targets[0]], patch)
    return objects


def _normalized(objects: list[dict]) -> dict[tuple[str, str], Any]:
    """Objects by (kind, name), with merged lists sorted (kustomize orders them its own way)."""

    def sort_lists(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: sort_lists(item) for key, item in value.items()}
        if isinstance(value, list):
            items = [sort_lists(item) for item in value]
            if items and all(isinstance(item, dict) for item in items):
                return sorted(items, key=lambda item: yaml.safe_dump(item, sort_keys=True))
            return items
        return value

    return {(obj["kind"], obj["metadata"]["name"]): sort_lists(obj) for obj in objects}


@cache
def rendered(overlay: str) -> dict[str, dict]:
    """The overlay's objects by kind (one of each kind in these manifests)."""
    objects = render(KUBERNETES / "overlays" / overlay)
    by_kind = {obj["kind"]: obj for obj in objects}
    assert len(by_kind) == len(objects), "one object per kind expected"
    return by_kind


def container(overlay: str) -> dict:
    [only] = rendered(overlay)["Deployment"]["spec"]["template"]["spec"]["containers"]
    return only


def env(overlay: str) -> dict[str, str]:
    """The container's plain variables (those from a Secret: ``env_from_secrets``)."""
    return {item["name"]: item["value"] for item in container(overlay)["env"] if "value" in item}


def env_from_secrets(overlay: str) -> dict[str, dict]:
    return {
        item["name"]: item["valueFrom"]["secretKeyRef"]
        for item in container(overlay)["env"]
        if "secretKeyRef" in item.get("valueFrom", {})
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_shared_database_url_comes_from_an_optional_secret(overlay):
    # A password never sits in a manifest; without the Secret the pods run on SQLite.
    assert "MT_DATABASE_URL" not in env(overlay)
    reference = env_from_secrets(overlay)["MT_DATABASE_URL"]
    assert reference == {"name": "mtserve-database", "key": "url", "optional": True}


# --- validity -------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_trust_the_ingress_in_the_pod_network_to_name_the_client(overlay):
    from service.web.forwarded import TrustedProxies

    proxies = TrustedProxies.parse(env(overlay)["MT_TRUSTED_PROXIES"])
    assert proxies.trusts("10.244.1.17"), "an ingress controller pod"
    assert not proxies.trusts("203.0.113.9")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_kubernetes_schema(overlay):
    objects = rendered(overlay)
    assert set(objects) == {
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
    }
    for obj in objects.values():
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_schema_validation_rejects_a_misspelled_field():
    deployment = copy.deepcopy(rendered("cpu")["Deployment"])
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kubectl_kustomize_renders_the_same_objects(overlay):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl here: the overlays were rendered by the test's own merge only")
    result = subprocess.run(
        [kubectl, "kustomize", str(KUBERNETES / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    by_kubectl = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    assert _normalized(by_kubectl) == _normalized(list(rendered(overlay).values()))


# --- the contract ---------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_use_ready_for_startup_and_readiness_and_health_for_liveness(overlay):
    spec = container(overlay)
    assert spec["startupProbe"]["httpGet"]["path"] == "/ready"
    assert spec["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert spec["livenessProbe"]["httpGet"]["path"] == "/health"
    port_names = {port["name"] for port in spec["ports"]}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert spec[probe]["httpGet"]["port"] in port_names
    # Liveness must not restart a pod that is still loading its model.
    startup = spec["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_grace_period_covers_prestop_and_the_services_drain(overlay):
    pod = rendered(overlay)["Deployment"]["spec"]["template"]["spec"]
    command = container(overlay)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop_s = float(command[1])
    drain_s = float(env(overlay)["MT_SHUTDOWN_GRACE_S"])
    # The kubelet's grace period starts with preStop; SIGTERM comes after it, and the service
    # then drains for MT_SHUTDOWN_GRACE_S: SIGKILL must come later still.
    assert pod["terminationGracePeriodSeconds"] > pre_stop_s + drain_s


def test_gpu_variant_requests_one_nvidia_gpu_and_cuda():
    spec = container("gpu")
    assert spec["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert env("gpu")["MT_PROVIDER"] == "cuda"
    assert spec["image"].endswith("-gpu")
    tolerations = rendered("gpu")["Deployment"]["spec"]["template"]["spec"]["tolerations"]
    assert any(t["key"] == "nvidia.com/gpu" for t in tolerations)


def test_cpu_variant_requests_no_gpu_and_leaves_the_event_loop_one_of_its_cpus():
    spec = container("cpu")
    assert "nvidia.com/gpu" not in str(spec["resources"])
    assert env("cpu")["MT_PROVIDER"] == "cpu"
    # the engine's threads: one fewer than the CPUs requested (the service's own default on
    # a machine it sees whole), at least 1
    cpus = int(spec["resources"]["requests"]["cpu"])
    assert int(env("cpu")["MT_INTRA_OP_THREADS"]) == max(1, cpus - 1)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_hpa_scales_the_deployment_on_the_adapters_load_metric_with_cpu_fallback(overlay):
    objects = rendered(overlay)
    hpa = objects["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"]["name"] == objects["Deployment"]["metadata"]["name"]
    assert hpa["minReplicas"] >= 2  # the PDB then always leaves one pod serving
    metrics = {metric["type"]: metric for metric in hpa["metrics"]}
    assert metrics["Resource"]["resource"]["name"] == "cpu"
    load_metric = metrics["Pods"]["pods"]["metric"]["name"]
    adapter = yaml.safe_load((KUBERNETES / "prometheus-adapter" / "values.yaml").read_text())
    exposed = {rule["name"]["as"] for rule in adapter["rules"]["custom"]}
    assert load_metric in exposed
    # The adapter's query reads metrics the service exports.
    from service.metrics import ServiceMetrics

    exported = ServiceMetrics().render().decode()
    for rule in adapter["rules"]["custom"]:
        for name in ("mt_inflight_rows", "mt_queue_depth"):
            if name in rule["metricsQuery"]:
                assert f"# TYPE {name} gauge" in exported


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_and_pdb_select_the_deployments_pods(overlay):
    objects = rendered(overlay)
    pod_labels = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    for selector in (
        objects["Service"]["spec"]["selector"],
        objects["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"],
        objects["Deployment"]["spec"]["selector"]["matchLabels"],
    ):
        assert selector.items() <= pod_labels.items()
    assert objects["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1
    target_port = objects["Service"]["spec"]["ports"][0]["targetPort"]
    assert target_port in {port["name"] for port in container(overlay)["ports"]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_data_directory_is_a_writable_volume_under_the_read_only_root(overlay):
    data_dir = env(overlay)["MT_DATA_DIR"]
    assert data_dir.startswith("/")
    assert container(overlay)["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in container(overlay)["volumeMounts"]}
    pod = rendered(overlay)["Deployment"]["spec"]["template"]["spec"]
    volumes = {v["name"] for v in pod["volumes"]}
    assert data_dir in mounts and mounts[data_dir] in volumes
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]


def test_an_init_container_pulls_the_models_that_the_server_then_serves():
    pod = rendered("pulled-models")["Deployment"]["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    assert init["image"].endswith("-models")  # torch and the exporter: not the server's image
    assert init["command"] == ["python", "-m", "service", "models", "sync"]
    init_env = {item["name"]: item.get("value") for item in init["env"]}
    assert init_env["MT_MODELS"] == "opus-mt-en-fr"
    pulled = init_env["MT_MODELS_DIR"]
    assert env("pulled-models")["MT_MODELS_DIR"] == pulled
    init_mounts = {m["mountPath"]: m for m in init["volumeMounts"]}
    server_mounts = {m["mountPath"]: m for m in container("pulled-models")["volumeMounts"]}
    assert init_mounts[pulled]["name"] == server_mounts[pulled]["name"] == "models"
    assert server_mounts[pulled]["readOnly"] is True and not init_mounts[pulled].get("readOnly")
    assert init_mounts[init_env["HF_HOME"]]["name"] == "hf-cache"
    assert {"models", "hf-cache", "tmp"} <= {volume["name"] for volume in pod["volumes"]}
    assert init["securityContext"]["readOnlyRootFilesystem"] is True
    for overlay in ("cpu", "gpu"):  # the plain variants download nothing
        assert "initContainers" not in rendered(overlay)["Deployment"]["spec"]["template"]["spec"]
