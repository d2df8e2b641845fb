"""pdx bench --prometheus: the leg's figures, read back from a real Prometheus (Debian's).

Prometheus scrapes, every second, a loopback endpoint serving the router's real metrics
registry (pdx_router.metrics.Metrics) plus a NIXL histogram; the test records known turns on
it and reads the figures over the window that holds them.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from pdx.local.topology import free_port
from pdx_bench import panels, prometheus
from pdx_bench.localprom import local_prometheus
from pdx_router.metrics import Metrics
from pdx_router.policy import Outcome

from .fakeserver import EXAMPLE, FakeRouter, FakeTopology, ThreadedFake
from .test_sweep_cli import _args

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus: apt-get install prometheus (scripts/test.sh does)"),
]


class Exporter:
    """The router's registry and a NIXL counter, served on /metrics."""

    def __init__(self) -> None:
        self.metrics = Metrics()
        self.transfers = 0
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                nixl = f'vllm:nixl_xfer_time_seconds_count{{pdx_component="decode"}} {exporter.transfers}\n'
                body = generate_latest(exporter.metrics.registry) + nixl.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.target = f"127.0.0.1:{self.server.server_address[1]}"


@dataclass
class Scraping:
    url: str
    exporter: Exporter


@pytest.fixture(scope="module")
def scraping() -> Iterator[Scraping]:
    exporter = Exporter()
    try:
        with local_prometheus() as prom:
            prom.scrape([{"targets": [exporter.target], "labels": {"pdx_instance": "qwen"}}])
            yield Scraping(prom.url, exporter)
    finally:
        exporter.server.shutdown()


def test_a_legs_figures_are_the_turns_it_recorded(scraping: Scraping) -> None:
    m = scraping.exporter.metrics
    time.sleep(2.5)  # counters scraped at zero inside the window
    start = time.time() - 2
    for outcome, tokens in [(Outcome.HIT, 100), (Outcome.HIT, 100), (Outcome.HIT, 100), (Outcome.EXPIRED, 0)]:
        m.outcome(outcome, tokens)
        m.outcome(Outcome.MISS)
        m.ttft.observe(0.2)
        scraping.exporter.transfers += 5
        time.sleep(0.6)
    time.sleep(2.5)  # the last turn scraped
    end = time.time()
    got = prometheus.read(scraping.url, start, end, instance="qwen")
    assert got["hit rate"] == pytest.approx(0.75, abs=0.01)  # misses had no entry: not counted
    assert got["reused tokens per hit"] == pytest.approx(100, abs=1)
    assert got["router TTFT p50 (ms)"] is not None and 100 <= got["router TTFT p50 (ms)"] <= 250
    assert got["NIXL transfers"] is not None and 15 <= got["NIXL transfers"] <= 30
    assert got["NIXL MiB"] is None  # nothing exported: said, not shown as 0
    # Another instance's figures are not these.
    assert prometheus.read(scraping.url, start, end, instance="other")["hit rate"] is None


def test_the_report_carries_the_figures_of_the_leg(scraping: Scraping, tmp_path: Path) -> None:
    with ThreadedFake(FakeRouter(first_token_delay=0.0, token_delay=0.0)) as fake:
        args = _args(
            "--url", fake.url, "--lengths", "50", "--turns", "2", "--conversations", "1", "--user-tokens", "3",
            "--tool-tokens", "3", "--output-tokens", "2", "--out", str(tmp_path), "--no-warmup",
            "--prometheus", scraping.url,
        )  # fmt: skip
        assert args.run(args) == 0
    report = (tmp_path / "report.md").read_text()
    assert "Prometheus, leg run" in report and "hit rate" in report


def test_a_local_run_scraped_by_its_own_prometheus_reports_and_draws_each_leg(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pdx bench --local --prometheus local`: each leg's pods scraped as they come up."""
    monkeypatch.setattr("pdx_bench.sweep._local_topology", FakeTopology)
    out = tmp_path / "out"
    args = _args(
        "-f", str(EXAMPLE), "--local", "--lengths", "200", "--turns", "3", "--conversations", "2",
        "--user-tokens", "5", "--tool-tokens", "5", "--output-tokens", "3", "--out", str(out), "--no-warmup",
        "--prometheus", "local",
    )  # fmt: skip
    assert args.run(args) == 0
    report = (out / "report.md").read_text()
    on = next(line for line in report.splitlines() if "Prometheus, leg on" in line)
    off = next(line for line in report.splitlines() if "Prometheus, leg off" in line)
    assert "hit rate 1" in on and "hit rate no data" in off  # off: every turn a miss, none with an entry
    assert (out / "dashboard.png").read_bytes()[:4] == b"\x89PNG"
    assert "dashboard panels without data" in report


def test_the_panels_are_drawn_from_the_legs_series(scraping: Scraping, tmp_path: Path) -> None:
    m = scraping.exporter.metrics
    start = time.time() - 1
    for _ in range(4):
        m.outcome(Outcome.HIT, 50)
        time.sleep(0.5)
    time.sleep(2.5)
    counts = panels.draw(scraping.url, {"on": (start, time.time())}, tmp_path / "d.png", step=1)
    assert counts["Reuse outcomes"] >= 1 and counts["KV cache usage"] == 0  # no engine exported it
    assert (tmp_path / "d.png").read_bytes()[:4] == b"\x89PNG"
    assert panels.legend("{{outcome}} of {{pdx_instance}}", {"outcome": "hit"}) == "hit of "


def test_an_unreachable_prometheus_is_named_not_fatal() -> None:
    lines = prometheus.context(f"http://127.0.0.1:{free_port()}", {"on": (time.time() - 10, time.time())})
    assert lines["Prometheus, leg on"].startswith("not read from http://127.0.0.1:")


def test_legs_run_from_their_start_to_the_next() -> None:
    assert prometheus.windows({"on": 20.0, "off": 10.0}, 35.0) == {"off": (10.0, 20.0), "on": (20.0, 35.0)}
