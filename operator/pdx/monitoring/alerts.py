"""The alert rules, as data: each one says what broke and what to change.

Counters are queried with the `_total` suffix prometheus_client and vLLM expose. Route and
status are matched by pattern (status=~"5.."), so the rules hold whatever route values the
router reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pdx.monitoring import BY, COMPONENT_LABEL

GROUP = "pdx"
REUSE = "pdx_router_reuse_total"


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: Literal["warning", "critical"]
    summary: str
    description: str  # what to do, naming the field or metric to look at
    signals: tuple[str, ...]
    """The parts of `expr` that read data (the compared values, without their thresholds): on a
    healthy fleet `expr` returns nothing, these must return series (tests/e2e/test_prometheus.py)."""

    def rule(self) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity},
            "annotations": {"summary": self.summary, "description": self.description},
        }


def _rate(selector: str, window: str, offset: str = "") -> str:
    off = f" offset {offset}" if offset else ""
    return f"sum by ({BY}) (rate({selector}[{window}]{off}))"


def hit_rate(window: str, offset: str = "") -> str:
    """Turns that built on decode's KV (read back, or prefilled on that decode) over turns whose
    conversation had an entry: the operator's status.reuse.hitRate."""
    hits = _rate(f'{REUSE}{{outcome=~"hit|local"}}', window, offset)
    with_entry = _rate(f'{REUSE}{{outcome!="miss"}}', window, offset)
    return f"({hits} / {with_entry})"


_TURNS_WITH_ENTRY = _rate(f'{REUSE}{{outcome!="miss"}}', "15m")
_INSTANCE = "{{ $labels.namespace }}/{{ $labels.pdx_instance }}"
_LOST = _rate(REUSE + '{outcome=~"expired|declined"}', "15m")
_RELEASED = _rate(REUSE + '{outcome="released"}', "15m")
# Each router replica polls every decode: the same figure several times, so max, not sum.
_WAITED = f"max by ({BY}, decode) (increase(pdx_router_decode_held_kv_waited_total[10m]))"
_LAPSED = f"max by ({BY}, decode) (increase(pdx_router_decode_held_kv_lapsed_total[30m]))"
_MISMATCHES = f"sum by ({BY}) (increase(pdx_router_tokenize_mismatch_total[15m]))"
# Clients' inference requests only: a not-ready router's 503s to its readiness probe, and
# Prometheus's own scrapes, are no client errors.
_INFERENCE = 'route=~"/v1/(chat/)?completions"'
_REQUESTS = f"sum by ({BY}) (rate(pdx_router_requests_total{{{_INFERENCE}}}[5m]))"
# 0, not absent, while the router has answered no 5xx at all (no such series exists yet).
_5XX = f'(sum by ({BY}) (rate(pdx_router_requests_total{{{_INFERENCE}, status=~"5.."}}[5m])) or 0 * {_REQUESTS})'
_DECODE_KV = f'max by ({BY}, instance) (vllm:kv_cache_usage_perc{{{COMPONENT_LABEL}="decode"}})'
_DECODED = f'sum by ({BY}) (rate(vllm:request_success_total{{{COMPONENT_LABEL}="decode"}}[10m]))'
_TRANSFERS = f"sum by ({BY}) (rate(vllm:nixl_xfer_time_seconds_count[10m]))"
_RECONCILE_ERRORS = "sum by (namespace) (increase(pdx_operator_reconcile_errors_total[15m]))"
_BUILDS = "pdx_router_build_info"
# 0, not absent, while every router runs compiled (no pure series exists then).
_PURE_ROUTERS = f'(sum by ({BY}) ({_BUILDS}{{data_path="pure"}}) or 0 * sum by ({BY}) ({_BUILDS}))'


ALERTS: tuple[Alert, ...] = (
    Alert(
        name="PdxReuseHitRateFalling",
        expr=f"{hit_rate('15m')} < 0.5 * {hit_rate('15m', '1h')}\nand {_TURNS_WITH_ENTRY} > 0",
        signals=(hit_rate("15m"), hit_rate("15m", "1h"), _TURNS_WITH_ENTRY),
        for_="10m",
        severity="warning",
        summary=f"{_INSTANCE}: reuse hit rate fell below half of what it was an hour ago",
        description=(
            "Turns keep coming but fewer of them read their KV back from decode, so TTFT climbs "
            "again. Look at the reuse outcomes panel: expired or declined means the TTL is too "
            "short (raise spec.kvTransfer.decoderKvBlocksTtlSeconds, see "
            "PdxReuseReadsExpiredOrDeclined); prefix_mismatch means the client "
            "rewrites history (a changed system prompt or stripped reasoning); a decode restart "
            "drops every entry it held. Compare with the instance's status.reuse.hitRate."
        ),
    ),
    Alert(
        name="PdxReuseReadsExpiredOrDeclined",
        expr=f"{_LOST}\n/ {_TURNS_WITH_ENTRY} > 0.2",
        signals=(_LOST, _TURNS_WITH_ENTRY),
        for_="10m",
        severity="warning",
        summary=f"{_INSTANCE}: over 20% of returning turns found their KV expired or declined",
        description=(
            "Conversations come back after decode has dropped (expired) or is about to drop "
            "(declined) their KV, so prefill recomputes it. Set spec.kvTransfer."
            "decoderKvBlocksTtlSeconds to the instance's status.reuse.recommendedTtlSeconds "
            "(kubectl get disaggregatedinference NAME -o jsonpath='{.status.reuse."
            "recommendedTtlSeconds}'), and check decode has the KV room to hold it longer "
            "(PdxDecodeKvCacheNearFull)."
        ),
    ),
    Alert(
        name="PdxHeldKvReleasedUnderPressure",
        expr=f"{_RELEASED}\n/ {_TURNS_WITH_ENTRY} > 0.2",
        signals=(_RELEASED, _TURNS_WITH_ENTRY),
        for_="15m",
        severity="warning",
        summary=f"{_INSTANCE}: over 20% of returning turns found their KV released under memory pressure",
        description=(
            "Decode's KV cache is too small for the conversations live within the TTL: it released "
            "their held KV to admit new work, and those turns recomputed "
            "their history (outcome released). Nothing waits, but TTFT climbs for them. Add decode "
            "replicas (spec.decode.replicas), or give decode more KV memory; a longer TTL does not help. "
            "docs/operator.md, \"Sizing the TTL and decode's KV\"."
        ),
    ),
    Alert(
        name="PdxHeldKvMadeRequestsWait",
        expr=f"{_WAITED} > 0",
        signals=(_WAITED,),
        for_="5m",
        severity="warning",
        summary=f"{_INSTANCE}: decode {{{{ $labels.decode }}}} made new requests wait behind held KV",
        description=(
            "Decode refused KV blocks to new requests while it kept finished turns' KV for their next "
            "turn: held KV is a hard pin there, and those requests wait up to the TTL. Either the valve "
            "is off (the instance's HeldKvPinned condition says so: releaseUnderPressure is "
            "false, or the engine's log shows 'pdx plugin' could not patch its vLLM), or every hold "
            "was being read at once. Set spec.kvTransfer.releaseUnderPressure: true, or add decode replicas "
            "(spec.decode.replicas). "
            "docs/operator.md, \"Sizing the TTL and decode's KV\"."
        ),
    ),
    Alert(
        name="PdxHeldKvClaimsLapsed",
        expr=f"{_LAPSED} > 2",
        signals=(_LAPSED,),
        for_="10m",
        severity="warning",
        summary=f"{_INSTANCE}: claims on decode {{{{ $labels.decode }}}}'s held KV ran out their lease, never dropped",
        description=(
            "The router claims a hold before prefill reads it and drops the claim once prefill has "
            "answered. These claims were never dropped: a router stopped mid-turn (a rollout, an OOM "
            "kill), or its calls to decode failed. Each pinned its hold for the claim's lease "
            "(PDX_HELD_KV_CLAIM_LEASE, 30 s) instead of the TTL, so little is lost; a steady rate "
            "points at routers restarting (kubectl get pods -l app.kubernetes.io/component=router: "
            "RESTARTS) or at calls to decode failing (the router's log: 'holds call on ... failed'). "
            "docs/router.md, \"A claim whose drop never comes\"."
        ),
    ),
    Alert(
        name="PdxTokenizerMismatch",
        expr=f"{_MISMATCHES} > 0",
        signals=(_MISMATCHES,),
        for_="0m",
        severity="warning",
        summary=f"{_INSTANCE}: the router's prompt ids differ from the engine's",
        description=(
            "The router dropped reuse entries because its tokenizer or chat template does not "
            "match the engine's (a different model revision or template). Reuse stays safe but "
            "is lost for those turns. Set spec.router.tokenizer: engine, or make "
            "spec.model.revision the same for the router and the engines."
        ),
    ),
    Alert(
        name="PdxRouterErrors",
        expr=f"{_5XX}\n/ {_REQUESTS} > 0.05",
        signals=(_5XX, _REQUESTS),
        for_="5m",
        severity="critical",
        summary=f"{_INSTANCE}: over 5% of the router's completions answers are 5xx",
        description=(
            "Clients get errors. pdx_router_upstream_errors_total{role} names the failing role: "
            "look at that role's engine logs and readiness (kubectl get pods -l "
            "app.kubernetes.io/instance=NAME), and at the router's log for the upstream error."
        ),
    ),
    Alert(
        name="PdxDecodeKvCacheNearFull",
        expr=f"{_DECODE_KV} > 0.9",
        signals=(_DECODE_KV,),
        for_="10m",
        severity="warning",
        summary="{{ $labels.instance }}: decode KV cache over 90% full",
        description=(
            "Decode holds every conversation's KV for the TTL; when the cache is full, vLLM "
            "evicts it early (reuse turns into expired) or queues requests. Add decode replicas "
            "(spec.decode.replicas), lower spec.model.maxNumSeqs, or shorten "
            "spec.kvTransfer.decoderKvBlocksTtlSeconds."
        ),
    ),
    Alert(
        name="PdxNoKvTransfers",
        expr=f"{_DECODED} > 0\nunless {_TRANSFERS} > 0",
        signals=(_DECODED, _TRANSFERS),
        for_="10m",
        severity="critical",
        summary=f"{_INSTANCE}: decode serves requests but no NIXL transfer happened",
        description=(
            "Every disaggregated request moves KV over NIXL; none did in 10 minutes, so the "
            "KV connector is not loaded, or transfers fall back to a path that is not counted. "
            "Check the engines' logs for the NIXL backend they chose (spec.kvTransfer.backends; "
            "on EFA, LIBFABRIC and the EFA devices in spec.placement) and "
            "vllm:nixl_num_failed_transfers_total."
        ),
    ),
    Alert(
        name="PdxRouterPurePython",
        expr=f"{_PURE_ROUTERS} > 0",
        signals=(_PURE_ROUTERS,),
        for_="15m",
        severity="warning",
        summary=f"{_INSTANCE}: a router runs its pure-Python data path",
        description=(
            "The router's compiled data path was missing, or built for other sources or another "
            "Python, so it runs its .py modules and spends a few percent more CPU per request. "
            "Its start-up log line says why (data path: pure Python (...)). Point "
            "spec.router.image at an image built by images/router/Dockerfile, which compiles it "
            "and refuses to finish without it, and unset PDX_ROUTER_PURE in the router's "
            "environment."
        ),
    ),
    # Needs pdx_operator_reconcile_errors_total, which the operator does not export yet (kopf
    # has no metrics of its own and PDX_METRICS_PORT is not served): defined so that the rule
    # and its test exist when the counter does (docs/observability.md).
    Alert(
        name="PdxOperatorReconcileErrors",
        expr=f"{_RECONCILE_ERRORS} > 0",
        signals=(_RECONCILE_ERRORS,),
        for_="15m",
        severity="warning",
        summary="{{ $labels.namespace }}: the pdx operator keeps failing to reconcile",
        description=(
            "The operator could not apply an instance's children for 15 minutes, so spec "
            "changes are not rolled out. Its log names the instance and the API error (often "
            "RBAC or a webhook); kubectl describe disaggregatedinference NAME shows the "
            "Ready condition's message."
        ),
    ),
)


def rules_file() -> dict[str, Any]:
    """A Prometheus rules file (rule_files:), and the spec of the PrometheusRule below."""
    return {"groups": [{"name": GROUP, "rules": [a.rule() for a in ALERTS]}]}


def prometheus_rule(namespace: str, name: str = "pdx", labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The same rules for the Prometheus Operator (its ruleSelector usually matches `labels`)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": rules_file(),
    }
