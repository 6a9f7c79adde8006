"""Prometheus figures of a store (`StoreMetrics`), on a registry the app passes in. They live in
`harel_beanie.telemetry.metrics`; this module is the public path to them.
"""

from harel_beanie.telemetry.metrics import (
    COMMIT_BUCKETS,
    StoreMetrics,
    new_registry,
)

__all__ = [
    "COMMIT_BUCKETS",
    "StoreMetrics",
    "new_registry",
]
