"""Every alert, checked by promtool and tested on synthetic series: it fires when it should, not otherwise.

Series use promtool's notation at a 1m interval (`0+9x60` = 0, 9, 18, ... for 60 minutes).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdx.monitoring import alerts, files

pytestmark = pytest.mark.prometheus
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="no promtool: apt-get install prometheus (scripts/test.sh does)"
)

DI = {"namespace": "inference", "pdx_instance": "qwen"}
Series = dict[str, str]


def s(metric: str, values: str, **labels: str) -> tuple[str, str]:
    """One input series of instance `qwen` in namespace `inference`."""
    body = ", ".join(f'{k}="{v}"' for k, v in {**DI, **labels}.items())
    return f"{metric}{{{body}}}", values


def reuse(
    hit: str, expired: str = "0x120", declined: str = "0x120", miss: str = "0+100x120", released: str = "0x120"
) -> Series:
    # Misses are many and steady: an expression that counted them would dilute every rate.
    return dict(
        [
            s(alerts.REUSE, hit, outcome="hit"),
            s(alerts.REUSE, expired, outcome="expired"),
            s(alerts.REUSE, declined, outcome="declined"),
            s(alerts.REUSE, miss, outcome="miss"),
            s(alerts.REUSE, released, outcome="released"),
        ]
    )


def requests(ok: str, client_error: str, server_error: str, probe_error: str = "0x60") -> Series:
    route = "/v1/chat/completions"
    return dict(
        [
            s("pdx_router_requests_total", ok, route=route, status="200"),
            s("pdx_router_requests_total", client_error, route=route, status="404"),
            s("pdx_router_requests_total", server_error, route=route, status="502"),
            # A router that is not ready answers its readiness probe 503: no client saw it.
            s("pdx_router_requests_total", probe_error, route="/ready", status="503"),
        ]
    )


@dataclass(frozen=True)
class Case:
    firing: Series
    quiet: tuple[Series, ...]  # look alike, must not fire
    eval_time: str
    labels: dict[str, str]  # the firing alert's labels besides severity


DECODE = {"pdx_component": "decode", "instance": "10.0.0.7:8000"}
CASES: dict[str, Case] = {
    # 90% hits for an hour, then 20%: the hit rate fell, turns kept coming.
    "PdxReuseHitRateFalling": Case(
        firing=reuse(hit="0+9x60 540+2x60", expired="0+1x60 60+8x60"),
        quiet=(reuse(hit="0+9x120", expired="0+1x120"), reuse(hit="0+9x60 540x60", expired="0+1x60 60x60")),
        eval_time="100m",
        labels=DI,
    ),
    # 40% of returning turns expired or declined; the quiet one loses 5%.
    "PdxReuseReadsExpiredOrDeclined": Case(
        firing=reuse(hit="0+6x120", expired="0+3x120", declined="0+1x120"),
        quiet=(reuse(hit="0+19x120", expired="0+1x120"),),
        eval_time="40m",
        labels=DI,
    ),
    # A third of returning turns released under pressure; the quiet one releases 5% (and expires
    # as many: those are PdxReuseReadsExpiredOrDeclined's).
    "PdxHeldKvReleasedUnderPressure": Case(
        firing=reuse(hit="0+6x120", released="0+3x120"),
        quiet=(reuse(hit="0+19x120", released="0+1x120"), reuse(hit="0+6x120", expired="0+3x120")),
        eval_time="40m",
        labels=DI,
    ),
    # Decode refused blocks to a request a minute behind held KV; quiet: no waits, and waits that
    # stopped long ago (an engine's count since it started does not move).
    "PdxHeldKvMadeRequestsWait": Case(
        firing=dict([s("pdx_router_decode_held_kv_waited_total", "0+1x30", decode="decode-0")]),
        quiet=(
            dict([s("pdx_router_decode_held_kv_waited_total", "0x30", decode="decode-0")]),
            dict([s("pdx_router_decode_held_kv_waited_total", "0+1x5 5x60", decode="decode-0")]),
        ),
        eval_time="25m",
        labels={**DI, "decode": "decode-0"},
    ),
    # Three claims a quarter of an hour lapse for half an hour (routers restarting); quiet: one
    # lapse, as a single rollout leaves.
    "PdxHeldKvClaimsLapsed": Case(
        firing=dict([s("pdx_router_decode_held_kv_lapsed_total", "0+0.2x60", decode="decode-0")]),
        quiet=(dict([s("pdx_router_decode_held_kv_lapsed_total", "0x5 1x55", decode="decode-0")]),),
        eval_time="45m",
        labels={**DI, "decode": "decode-0"},
    ),
    "PdxTokenizerMismatch": Case(
        firing=dict([s("pdx_router_tokenize_mismatch_total", "0 0 0 0 0 1 1 1 1 1")]),
        quiet=(dict([s("pdx_router_tokenize_mismatch_total", "0x20")]),),
        eval_time="7m",
        labels=DI,
    ),
    # 10% 502s; the quiet ones: 19% 404s (a client's fault) and 1% 502s; no errors but 503s to probes.
    "PdxRouterErrors": Case(
        firing=requests(ok="0+80x60", client_error="0+10x60", server_error="0+10x60"),
        quiet=(
            requests(ok="0+80x60", client_error="0+19x60", server_error="0+1x60"),
            requests(ok="0+80x60", client_error="0x60", server_error="0x60", probe_error="0+30x60"),
        ),
        eval_time="20m",
        labels=DI,
    ),
    # Decode 95% full for 20 minutes; in the quiet one prefill is full (it holds nothing for long).
    "PdxDecodeKvCacheNearFull": Case(
        firing=dict([s("vllm:kv_cache_usage_perc", "0.95x30", **DECODE)]),
        quiet=(
            dict(
                [
                    s("vllm:kv_cache_usage_perc", "0.5x30", **DECODE),
                    s("vllm:kv_cache_usage_perc", "0.99x30", pdx_component="prefill", instance="10.0.0.6:8000"),
                ]
            ),
        ),
        eval_time="25m",
        labels={**DI, "instance": DECODE["instance"]},
    ),
    # Decode answers requests and no NIXL transfer is counted (the connector never moved KV);
    # quiet: transfers counted, or an idle fleet.
    "PdxNoKvTransfers": Case(
        firing=dict([s("vllm:request_success_total", "0+5x60", **DECODE)]),
        quiet=(
            dict(
                [
                    s("vllm:request_success_total", "0+5x60", **DECODE),
                    s("vllm:nixl_xfer_time_seconds_count", "0+5x60", **DECODE),
                ]
            ),
            dict([s("vllm:request_success_total", "0x60", **DECODE)]),
        ),
        eval_time="40m",
        labels=DI,
    ),
    "PdxRouterPurePython": Case(
        firing=dict([s("pdx_router_build_info", "1x60", data_path="pure", pod="router-0")]),
        quiet=(dict([s("pdx_router_build_info", "1x60", data_path="compiled", pod="router-0")]),),
        eval_time="40m",
        labels=DI,
    ),
    "PdxOperatorReconcileErrors": Case(
        firing={'pdx_operator_reconcile_errors_total{namespace="pdx-system"}': "0+1x60"},
        quiet=({'pdx_operator_reconcile_errors_total{namespace="pdx-system"}': "3x60"},),
        eval_time="40m",
        labels={"namespace": "pdx-system"},
    ),
}
BY_NAME = {a.name: a for a in alerts.ALERTS}


def _expanded(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), template)


def _test(series: Series, case: Case, alert: alerts.Alert, fires: bool) -> dict[str, Any]:
    labels = {**case.labels, "severity": alert.severity}
    expected = [
        {
            "exp_labels": labels,
            "exp_annotations": {"summary": _expanded(alert.summary, labels), "description": alert.description},
        }
    ]
    return {
        "interval": "1m",
        "input_series": [{"series": k, "values": v} for k, v in series.items()],
        "alert_rule_test": [
            {"eval_time": case.eval_time, "alertname": alert.name, "exp_alerts": expected if fires else []}
        ],
    }


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, check=False)


def test_every_alert_has_a_case() -> None:
    assert set(CASES) == set(BY_NAME)


@needs_promtool
def test_promtool_accepts_the_committed_rules_file() -> None:
    proc = _promtool("check", "rules", str(files.RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(alerts.ALERTS)} rules found" in proc.stdout


@needs_promtool
@pytest.mark.parametrize("name", list(CASES))
def test_alert_fires_on_its_failure_and_not_on_a_healthy_look_alike(name: str, tmp_path: Path) -> None:
    case, alert = CASES[name], BY_NAME[name]
    tests = [_test(case.firing, case, alert, fires=True)]
    tests += [_test(q, case, alert, fires=False) for q in case.quiet]
    spec = tmp_path / "tests.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(files.RULES)], "tests": tests}))
    proc = _promtool("test", "rules", str(spec))
    assert proc.returncode == 0, proc.stdout + proc.stderr
