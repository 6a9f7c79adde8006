"""`InstrumentedStore`, the store wrapper timing commits (and, given a tracer, an OpenTelemetry
span per operation). It lives in `harel_beanie.telemetry.instrument`; this module is the
public path to it.
"""

from harel_beanie.telemetry.instrument import (
    OPERATIONS,
    InstrumentedStore,
    otel_tracer,
)

__all__ = [
    "OPERATIONS",
    "otel_tracer",
    "InstrumentedStore",
]
