"""The monitoring files (deploy/prometheus/ alert rules, deploy/grafana/ dashboard) against the
metrics the app really serves: the rules pass ``promtool check rules`` (Debian's
``prometheus`` package; the test skips without it), and every metric a rule or a dashboard
panel queries is in ``/metrics`` of the test app after a little traffic."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from service.config import Settings
from service.wiring import create_app
from tests.service_fixtures import tiny_model

ROOT = Path(__file__).resolve().parents[2]
RULES = sorted((ROOT / "deploy" / "prometheus").glob("*.yml"))
DASHBOARDS = sorted((ROOT / "deploy" / "grafana").glob("*.json"))
# What is not a metric in a PromQL expression: functions, keywords, aggregation operators.
PROMQL_WORDS = frozenset(
    (
        *("sum", "min", "max", "avg", "count", "rate", "irate", "increase"),
        *("histogram_quantile", "clamp_min", "by", "without", "on", "ignoring"),
        *("group_left", "group_right", "and", "or", "unless", "bool", "offset"),
    )
)
# Durations ([5m]), strings, label matchers and grouping clauses hold no metric names.
_NOT_METRICS = re.compile(r'"[^"]*"|\{[^}]*\}|\[[^\]]*\]|\b(?:by|without|on|ignoring)\s*\([^)]*\)')
_IDENTIFIER = re.compile(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b")


def queried_metrics(expr: str) -> set[str]:
    """The metric names in a PromQL expression."""
    bare = _NOT_METRICS.sub(" ", expr)
    bare = re.sub(r"\b\d+(?:\.\d+)?(?:e-?\d+)?\b", " ", bare)
    return {name for name in _IDENTIFIER.findall(bare) if name not in PROMQL_WORDS}


def served_metrics(exposition: str) -> set[str]:
    """Every series name /metrics can have: the samples, and each declared family's names
    (a labelled family has no sample before its first label set)."""
    names = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            names.add(name)
            if kind in ("histogram", "summary"):
                names |= {f"{name}_bucket", f"{name}_count", f"{name}_sum"}
            if kind == "counter" and not name.endswith("_total"):
                names.add(f"{name}_total")
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def rule_expressions() -> list[str]:
    exprs = []
    for path in RULES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            exprs += [rule["expr"] for rule in group["rules"]]
    return exprs


def dashboard_expressions() -> list[str]:
    exprs = []
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())  # parses
        assert dashboard["panels"], path
        for panel in dashboard["panels"]:
            exprs += [target["expr"] for target in panel.get("targets", [])]
    return exprs


def test_the_alert_rules_pass_promtool():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("no promtool (apt-get install prometheus)")
    assert RULES
    result = subprocess.run(
        [promtool, "check", "rules", *map(str, RULES)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rules_alert_on_what_an_operator_must_know():
    names = " ".join(rule_expressions())
    for metric in (
        "mt_requests_total",  # error rate
        "mt_request_duration_seconds_bucket",  # p99
        "mt_rejections_total",  # queue full
        "mt_model_loads_total",  # a model that failed to load
        "mt_engine_alive",  # a dead engine
    ):
        assert metric in names, metric


@pytest.fixture(scope="module")
def exposition(tmp_path_factory):
    settings = Settings(
        exports=[tiny_model(tmp_path_factory)],
        provider="cpu",
        intra_op_threads=1,
        max_new_tokens=8,
        data_dir=tmp_path_factory.mktemp("monitoring_data"),
    )
    with TestClient(create_app(settings)) as client:
        for _ in range(3000):
            if client.get("/ready").status_code == 200:
                break
            time.sleep(0.01)
        translated = client.post("/v1/translate", json={"text": "Save the file. Open it."})
        assert translated.status_code == 200, translated.text
        assert client.post("/v1/translate", json={"text": 3}).status_code == 422  # a refusal
        job = client.post(
            "/v1/documents",
            files={"file": ("a.txt", b"Save the file.")},
            data={"target_lang": "de"},
        )
        assert job.status_code == 202, job.text
        for _ in range(3000):
            if client.get(f"/v1/documents/{job.json()['id']}").json()["status"] == "done":
                break
            time.sleep(0.01)
        yield client.get("/metrics").text


def test_every_metric_the_rules_and_dashboards_query_is_served(exposition):
    served = served_metrics(exposition)
    expressions = rule_expressions() + dashboard_expressions()
    assert len(expressions) > 10
    queried = set().union(*map(queried_metrics, expressions))
    assert {"mt_pair_translations_total", "process_cpu_seconds_total"} <= queried
    assert queried - served == set()


def test_metrics_per_pair_documents_by_state_process_and_health(exposition):
    sample = re.compile(r"^(\w+)\{([^}]*)\} (\S+)$", re.MULTILINE)
    values = {(name, labels): float(value) for name, labels, value in sample.findall(exposition)}
    [model] = {
        labels.split('model="')[1].split('"')[0]
        for metric, labels in values
        if metric == "mt_pair_translations_total"
    }
    pair = f'model="{model}",source="en",target="de"'
    assert values[("mt_pair_translations_total", pair)] >= 2  # the request and the document
    assert values[("mt_pair_sentences_total", pair)] >= 3
    assert values[("mt_pair_characters_total", pair)] >= len("Save the file. Open it.")
    assert values[("mt_pair_duration_seconds_count", pair)] >= 2
    assert values[("mt_document_jobs", 'state="done"')] == 1
    assert values[("mt_document_jobs", 'state="queued"')] == 0
    assert values[("mt_document_sentences_left", 'state="queued"')] == 0
    assert values[("mt_engine_alive", f'model="{model}"')] == 1
    assert values[("mt_phase", 'phase="ready"')] == 1
    assert re.search(r"^process_resident_memory_bytes \d", exposition, re.MULTILINE)
