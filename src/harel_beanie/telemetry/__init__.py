"""Telemetry over a store: Prometheus figures (`StoreMetrics`, on a registry the app passes
in) and the wrapper timing commits and, given a tracer, tracing each operation
(`InstrumentedStore`). Both sit above the read side and the shells and change neither; this
package's face is their public path.

The Prometheus names load on first use: `prometheus-client` comes with the `dashboard`
extra, and an app that only times its store has no need of it.
"""

from typing import TYPE_CHECKING, Any

from harel_beanie.telemetry.instrument import OPERATIONS, InstrumentedStore, otel_tracer

if TYPE_CHECKING:
    from harel_beanie.telemetry.metrics import COMMIT_BUCKETS, StoreMetrics, new_registry

_METRICS = ("COMMIT_BUCKETS", "StoreMetrics", "new_registry")


def __getattr__(name: str) -> Any:
    if name in _METRICS:
        from harel_beanie.telemetry import metrics

        return getattr(metrics, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["COMMIT_BUCKETS", "OPERATIONS", "InstrumentedStore", "StoreMetrics", "new_registry", "otel_tracer"]
