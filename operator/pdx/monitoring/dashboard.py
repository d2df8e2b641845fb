"""The Grafana dashboard, as data: one panel per question a person asks during an incident."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pdx.monitoring import BY, COMPONENT_LABEL
from pdx.monitoring.alerts import REUSE, hit_rate

UID = "pdx-overview"
TITLE = "pdx: disaggregated inference"
# Grafana variables a query may hold, with the value a test substitutes (their defaults).
VARIABLES = {"ttl": "480"}
_ROLES = f"{BY}, {COMPONENT_LABEL}"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    queries: tuple[Query, ...]
    description: str = ""


def _quantile(q: float, metric: str, by: str = BY) -> str:
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket[5m])))"


PANELS: tuple[Panel, ...] = (
    Panel(
        "TTFT",
        "s",
        (
            Query(_quantile(0.5, "pdx_router_ttft_seconds"), "router p50"),
            Query(_quantile(0.95, "pdx_router_ttft_seconds"), "router p95"),
            Query(_quantile(0.95, "vllm:time_to_first_token_seconds", _ROLES), "{{pdx_component}} engine p95"),
        ),
        "What clients wait for, seen by the router, beside each engine's own view.",
    ),
    Panel(
        "Requests by route and status",
        "reqps",
        (Query(f"sum by ({BY}, route, status) (rate(pdx_router_requests_total[5m]))", "{{route}} {{status}}"),),
    ),
    Panel(
        "Reuse outcomes",
        "ops",
        (Query(f"sum by ({BY}, outcome) (rate({REUSE}[5m]))", "{{outcome}}"),),
        "hit: prefill read the KV back from decode. local: prefilled on the decode that held it."
        " expired/declined: the TTL is too short.",
    ),
    Panel(
        "Decode-local: turns sent through prefill instead, by why",
        "ops",
        (Query(f"sum by ({BY}, why) (rate(pdx_router_decode_local_skipped_total[5m]))", "{{why}}"),),
        "Turns that could read decode's KV but went the D->P way: long (above decodeLocalMaxTokens), busy"
        " (decodeLocalMaxBusy in flight on their decode), unknown (an edited history), holder (decode not serving).",
    ),
    Panel(
        "Conversations found, by how",
        "ops",
        (Query(f"sum by ({BY}, by) (rate(pdx_router_conversations_found_total[5m]))", "{{by}}"),),
        "Turns that found their entry: by conversation_id (id), X-Session-ID (header) or the history of"
        " their messages (history: clients that send no id).",
    ),
    Panel(
        "Reuse hit rate",
        "percentunit",
        (Query(hit_rate("5m"), "hit rate"),),
        "Hits over turns whose conversation had an entry: status.reuse.hitRate.",
    ),
    Panel(
        "Reused tokens per reused turn",
        "short",
        (
            Query(
                f"sum by ({BY}) (rate(pdx_router_reused_tokens_total[5m]))\n"
                f'/ sum by ({BY}) (rate({REUSE}{{outcome="hit"}}[5m]))',
                "tokens",
            ),
        ),
    ),
    Panel(
        "Inter-turn gap against the KV TTL",
        "s",
        (
            Query(_quantile(0.5, "pdx_router_inter_turn_gap_seconds"), "gap p50"),
            Query(_quantile(0.95, "pdx_router_inter_turn_gap_seconds"), "gap p95"),
            Query("vector($ttl)", "decoderKvBlocksTtlSeconds"),
        ),
        "A p95 above the TTL line means returning turns find their KV gone: raise the TTL "
        "to status.reuse.recommendedTtlSeconds ($ttl is the dashboard's TTL variable).",
    ),
    Panel(
        "Prefill and decode queues",
        "short",
        (
            Query(f"sum by ({_ROLES}) (vllm:num_requests_waiting)", "{{pdx_component}} waiting"),
            Query(f"sum by ({_ROLES}) (vllm:num_requests_running)", "{{pdx_component}} running"),
        ),
    ),
    Panel(
        "KV cache usage",
        "percentunit",
        (Query(f"max by ({_ROLES}, instance) (vllm:kv_cache_usage_perc)", "{{pdx_component}} {{instance}}"),),
    ),
    Panel(
        "NIXL transfer time",
        "s",
        (
            Query(_quantile(0.5, "vllm:nixl_xfer_time_seconds", _ROLES), "{{pdx_component}} p50"),
            Query(_quantile(0.95, "vllm:nixl_xfer_time_seconds", _ROLES), "{{pdx_component}} p95"),
        ),
        "Measured by the engine that reads: decode (P->D) and, with bidirectional, prefill (D->P).",
    ),
    Panel(
        "NIXL bytes",
        "Bps",
        (Query(f"sum by ({_ROLES}) (rate(vllm:nixl_bytes_transferred_sum[5m]))", "{{pdx_component}}"),),
    ),
    Panel(
        "Router latency",
        "s",
        (
            Query(_quantile(0.95, "pdx_router_prefill_seconds"), "prefill hop p95"),
            Query(_quantile(0.99, "pdx_router_ttft_seconds"), "TTFT p99"),
        ),
    ),
    Panel(
        "Router CPU",
        "short",
        (
            Query(
                'sum by (namespace, pod) (rate(container_cpu_usage_seconds_total{container="router"}[5m]))',
                "{{pod}} cores",
            ),
        ),
        "From the kubelet's cAdvisor metrics (the router exports no process metrics).",
    ),
)


def queries() -> list[str]:
    return [q.expr for p in PANELS for q in p.queries]


def expand(expr: str) -> str:
    """A query with the dashboard variables at their defaults, as Prometheus would get it."""
    for name, value in VARIABLES.items():
        expr = expr.replace(f"${name}", value)
    return expr


def _panel(i: int, panel: Panel) -> dict[str, Any]:
    return {
        "id": i + 1,
        "type": "timeseries",
        "title": panel.title,
        "description": panel.description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": (i % 2) * 12, "y": (i // 2) * 8},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "expr": q.expr,
                "legendFormat": q.legend,
                "refId": chr(ord("A") + j),
            }
            for j, q in enumerate(panel.queries)
        ],
    }


def dashboard() -> dict[str, Any]:
    """The dashboard JSON Grafana imports (and its sidecar loads from the chart's ConfigMap)."""
    return {
        "uid": UID,
        "title": TITLE,
        "tags": ["pdx"],
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
                {
                    "name": "ttl",
                    "type": "custom",
                    "label": "KV TTL (s)",
                    "query": VARIABLES["ttl"],
                    "current": {"text": VARIABLES["ttl"], "value": VARIABLES["ttl"]},
                },
            ]
        },
        "panels": [_panel(i, p) for i, p in enumerate(PANELS)],
    }
