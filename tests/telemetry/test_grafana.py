"""docs/grafana/harel-beanie.json queries only metrics `StoreMetrics` registers: a renamed
metric cannot leave the Grafana dashboard silently empty."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from harel_beanie.telemetry import StoreMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "harel-beanie.json"


def test_every_query_names_a_registered_metric() -> None:
    registry = CollectorRegistry()
    StoreMetrics(registry)
    known = {
        sample
        for metric in registry.collect()
        for sample in ([metric.name] + [f"{metric.name}{s}" for s in ("_total", "_bucket", "_count", "_sum")])
    }
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    for expr in exprs:
        names = set(re.findall(r"\b(harel_[a-z_]+)\b", expr))
        assert names and names <= known, (expr, names - known)
