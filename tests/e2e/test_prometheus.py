"""A real Prometheus scrapes a real `pdx local` run; every panel and alert query is run on it.

Debian's prometheus, started here on loopback with a scrape config written here (1 s interval),
scrapes the router's and the engines' /metrics while a few short multi-turn conversations run
with bidirectional on. The scrape adds the labels the rendered PodMonitor would
(`pdx.render.monitoring`), so the queries are the ones a cluster runs. Then, through the HTTP
API: every dashboard query and every alert's signals return series (or are listed in
`NO_LOCAL_DATA` with why), every alert expression parses and returns nothing on a healthy run,
and the hit-rate panel shows the reuse the router's /v1/pdx/stats reports.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pdx.local.topology import LocalTopology
from pdx.monitoring import alerts, dashboard
from pdx_bench.localprom import local_prometheus, scrape_targets
from tests.e2e.chat import Answer, chat
from tests.e2e.conversations import asst, text, user
from tests.e2e.test_real_engines import document

pytest.importorskip("vllm", reason="needs the engine extra (scripts/setup.sh)")
PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.engines,
    pytest.mark.prometheus,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus: apt-get install prometheus (scripts/test.sh does)"),
]

# Queries the local run cannot give data to, and why. Everything else must return series.
NO_LOCAL_DATA: dict[str, str] = {
    'sum by (namespace, pod) (rate(container_cpu_usage_seconds_total{container="router"}[5m]))': (
        "the kubelet's cAdvisor metrics: no kubelet runs the local processes"
    ),
    alerts.hit_rate("15m", "1h"): "the hit rate an hour ago: the run is a few minutes long",
    "sum by (namespace) (increase(pdx_operator_reconcile_errors_total[15m]))": (
        "the operator does not run in pdx local (its own /metrics: tests/operator/test_metrics.py)"
    ),
}
SYSTEM = {"role": "system", "content": "You are a coding agent. " + text(1, 200)}
EDITED = {"role": "system", "content": "You are a reviewer. " + text(2, 200)}


def conversation(k: int) -> list[Any]:
    """Three growing turns; the third of conversation 1 swaps the system prompt (not a hit)."""
    first = [SYSTEM, user(400 + k, 40)]
    third_system = EDITED if k == 1 else SYSTEM
    return [
        lambda a: first,
        lambda a: [*first, asst(a[0]), user(500 + k, 40)],
        lambda a: [third_system, first[1], asst(a[0]), user(500 + k, 40), asst(a[1]), user(600 + k, 40)],
    ]


@dataclass
class Scraped:
    url: str
    stats: dict[str, Any]
    answers: list[Answer]
    workload_seconds: float
    total_seconds: float


def _api(base: str, path: str, **params: str) -> dict[str, Any]:
    url = f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            doc: dict[str, Any] = json.loads(resp.read())
    except urllib.error.HTTPError as err:  # a bad query answers 400 with the parse error
        doc = json.loads(err.read())
    return doc


def query(base: str, expr: str) -> dict[str, Any]:
    return _api(base, "query", query=dashboard.expand(expr))


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    assert PROMETHEUS is not None
    t0 = time.monotonic()
    tmp = tmp_path_factory.mktemp("prometheus")
    with LocalTopology(document(bidirectional=True), state_dir=tmp / "topology") as topo, local_prometheus() as prom:
        base = prom.url
        prom.scrape(scrape_targets(topo.router_url, topo.engine_urls, topo.target.name), timeout=60)
        time.sleep(2)  # a few scrapes of the counters at zero: rates start from the run's start
        w0, wall0 = time.monotonic(), time.time()
        answers: list[Answer] = []
        for k in range(2):
            turns: list[Answer] = []
            for build in conversation(k):
                turns.append(chat(topo.router_url, build(turns), conversation=f"prom{k}"))
            answers += turns
        workload = time.monotonic() - w0
        with urllib.request.urlopen(f"{topo.router_url}/v1/pdx/stats", timeout=10) as resp:
            stats = json.loads(resp.read())
        time.sleep(3)  # the last turn's counters scraped
        run = Scraped(base, stats, answers, workload, time.monotonic() - t0)
        yield run
        if os.environ.get("PDX_PROM_DUMP"):  # every query's values, for a report
            rows = [{"where": w, "expr": e, "result": query(base, e)["data"]["result"]} for w, e in _queries()]
            span = {"start": str(wall0 - 5), "end": str(time.time()), "step": "2"}
            for row in rows:
                ranged = _api(base, "query_range", query=dashboard.expand(row["expr"]), **span)
                row["range"] = ranged.get("data", {})
            run_facts = {
                "workload_seconds": workload,
                "setup_seconds": run.total_seconds - workload,
                "stats": stats,
                "turns": [{"reuse": a.reuse, "ttft_ms": a.ttft_ms, "prompt": a.prompt_tokens} for a in answers],
            }
            Path(os.environ["PDX_PROM_DUMP"]).write_text(json.dumps({"run": run_facts, "rows": rows}, indent=1))
    print(f"\nprometheus e2e: workload {workload:.1f}s, total {time.monotonic() - t0:.1f}s")


def _queries() -> list[tuple[str, str]]:
    out = [(f"panel {p.title!r}", q.expr) for p in dashboard.PANELS for q in p.queries]
    out += [(f"alert {a.name}", s) for a in alerts.ALERTS for s in a.signals]
    return out


def test_the_workload_reused_kv(scraped: Scraped) -> None:
    assert [a.reuse for a in scraped.answers[:3]] == ["miss", "hit", "hit"]
    assert scraped.stats["reuse"]["hit"] >= 3


def test_every_panel_query_and_alert_signal_returns_series_or_is_listed(scraped: Scraped) -> None:
    empty, listed_but_present, errors = [], [], []
    for where, expr in _queries():
        doc = query(scraped.url, expr)
        if doc["status"] != "success":
            errors.append(f"{where}: {doc.get('error')}")
            continue
        has_data = bool(doc["data"]["result"])
        if expr in NO_LOCAL_DATA and has_data:
            listed_but_present.append(where)
        elif expr not in NO_LOCAL_DATA and not has_data:
            empty.append(f"{where}: {expr}")
    assert not errors, errors
    assert not empty, "no series (add data or list it in NO_LOCAL_DATA with why):\n" + "\n".join(empty)
    assert not listed_but_present, f"listed as without local data but has it: {listed_but_present}"


def test_every_alert_expression_parses_and_none_fires_on_a_healthy_run(scraped: Scraped) -> None:
    for a in alerts.ALERTS:
        doc = query(scraped.url, a.expr)
        assert doc["status"] == "success", f"{a.name}: {doc.get('error')}"
        assert doc["data"]["result"] == [], f"{a.name} fires on a healthy run: {doc['data']['result']}"


def test_the_hit_rate_panel_shows_the_reuse_the_router_reports(scraped: Scraped) -> None:
    reuse = scraped.stats["reuse"]
    with_entry = sum(v for k, v in reuse.items() if k != "miss")
    expected = reuse["hit"] / with_entry
    assert 0 < expected < 1, f"the workload should mix hits and non-hits: {reuse}"
    assert scraped.workload_seconds < 240, "the panel's 5m rate window must cover the whole workload"
    (panel,) = [p for p in dashboard.PANELS if p.title == "Reuse hit rate"]
    (series,) = query(scraped.url, panel.queries[0].expr)["data"]["result"]
    assert float(series["value"][1]) == pytest.approx(expected, abs=0.02)
