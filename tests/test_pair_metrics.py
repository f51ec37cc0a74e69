"""Per-pair metrics: each translation counted under its model and pair, the series of a
pair looked up once and reused."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from service.metrics import ServiceMetrics


def sample(metrics: ServiceMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_each_translation_is_counted_under_its_model_and_pair():
    metrics = ServiceMetrics(CollectorRegistry())
    metrics.on_translation("en-de", "en", "de", sentences=2, characters=30, seconds=0.1)
    metrics.on_translation("en-de", "en", "de", sentences=1, characters=5, seconds=0.2)
    metrics.on_translation("de-en", "de", "en", sentences=4, characters=9, seconds=0.3)
    pair = {"model": "en-de", "source": "en", "target": "de"}
    other = {"model": "de-en", "source": "de", "target": "en"}
    assert sample(metrics, "mt_pair_translations_total", **pair) == 2
    assert sample(metrics, "mt_pair_sentences_total", **pair) == 3
    assert sample(metrics, "mt_pair_characters_total", **pair) == 35
    assert sample(metrics, "mt_pair_duration_seconds_count", **pair) == 2
    assert sample(metrics, "mt_pair_duration_seconds_sum", **pair) == 0.1 + 0.2
    assert sample(metrics, "mt_pair_translations_total", **other) == 1
    assert sample(metrics, "mt_pair_sentences_total", **other) == 4


def test_a_pairs_series_are_looked_up_once(monkeypatch):
    metrics = ServiceMetrics(CollectorRegistry())
    looked_up = []
    labels = MetricWrapperBase.labels

    def counting(self, *args, **kwargs):
        looked_up.append(kwargs)
        return labels(self, *args, **kwargs)

    monkeypatch.setattr(MetricWrapperBase, "labels", counting)
    for _ in range(3):
        metrics.on_translation("en-de", "en", "de", sentences=1, characters=5, seconds=0.1)
    assert len(looked_up) == 4  # translations, sentences, characters, latency: once each
