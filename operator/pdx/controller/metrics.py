"""The operator's own Prometheus metrics, served on PDX_METRICS_PORT (the chart's `metrics`).

kopf exports none, and a person needs to see failing reconciles (the PdxOperatorReconcileErrors
alert, pdx.monitoring) before a fleet drifts from its spec.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

REGISTRY = CollectorRegistry()
PASSES = Counter(
    "pdx_operator_reconcile_passes", "Reconcile passes, by result.", ["result"], registry=REGISTRY
)
ERRORS = Counter(
    "pdx_operator_reconcile_errors",
    "Reconcile passes that failed: an apply the API refused, or an API error.",
    ["reason"],
    registry=REGISTRY,
)
SECONDS = Histogram(
    "pdx_operator_reconcile_seconds",
    "Time of one reconcile pass.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
RESULTS = ("idle", "wrote", "invalid", "failed", "gone")


def passed(result: str, seconds: float) -> None:
    """One pass: `idle` (nothing to write), `wrote`, `invalid` (spec refused), `failed`, `gone`."""
    PASSES.labels(result).inc()
    SECONDS.observe(seconds)


def failed(reason: str) -> None:
    """`apply` (the API refused a child) or `api` (a read or write raised)."""
    ERRORS.labels(reason).inc()


def serve(env: os._Environ[str] | dict[str, str] = os.environ) -> int | None:
    """Start /metrics on PDX_METRICS_PORT, if set; returns the port."""
    port = env.get("PDX_METRICS_PORT")
    if not port:
        return None
    start_http_server(int(port), registry=REGISTRY)
    return int(port)
