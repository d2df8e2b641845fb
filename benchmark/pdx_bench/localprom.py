"""`pdx bench --local --prometheus local`: Debian's Prometheus on loopback, scraping each leg.

Each leg's topology is written as the scrape targets (file service discovery, re-read every
second) with the labels the rendered PodMonitor adds in a cluster, so the dashboard's and the
alerts' queries (pdx.monitoring) run unchanged on the local run.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from pdx.local.topology import free_port
from pdx.monitoring import COMPONENT_LABEL, INSTANCE_LABEL

NAMESPACE = "local"  # what a PodMonitor's scrape adds as `namespace`
SCRAPE_SECONDS = 1


class PrometheusMissing(RuntimeError):
    pass


def scrape_targets(router_url: str, engine_urls: Mapping[str, list[str]], instance: str) -> list[dict[str, Any]]:
    """One file_sd group per pod, labelled as in a cluster."""
    pods = [("router", router_url)] + [(role, url) for role, urls in engine_urls.items() for url in urls]
    return [
        {
            "targets": [url.removeprefix("http://")],
            "labels": {"namespace": NAMESPACE, INSTANCE_LABEL: instance, COMPONENT_LABEL: role},
        }
        for role, url in pods
    ]


def config(targets_file: Path) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "evaluation_interval": f"{SCRAPE_SECONDS}s"},
        "scrape_configs": [
            {
                "job_name": "pdx",
                "metrics_path": "/metrics",
                "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": f"{SCRAPE_SECONDS}s"}],
            }
        ],
    }


class LocalPrometheus:
    """A Prometheus process of its own (temporary storage), stopped with the context."""

    def __init__(self, root: Path) -> None:
        exe = shutil.which("prometheus")
        if exe is None:
            raise PrometheusMissing("no prometheus on PATH: apt-get install prometheus (scripts/test.sh does)")
        self.targets_file = root / "targets.json"
        self.targets_file.write_text("[]")
        (root / "prometheus.yml").write_text(yaml.safe_dump(config(self.targets_file)))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._log = open(root / "prometheus.log", "wb")  # noqa: SIM115 (closed in stop)
        self._proc = subprocess.Popen(
            [
                exe,
                f"--config.file={root / 'prometheus.yml'}",
                f"--storage.tsdb.path={root / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise PrometheusMissing(f"prometheus exited with {self._proc.returncode}; see its log")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return
            time.sleep(0.3)
        raise PrometheusMissing(f"prometheus did not get ready within {timeout:g} s")

    def scrape(self, groups: list[dict[str, Any]], timeout: float = 30.0) -> None:
        """Scrape these pods from now on, and wait until each one is up."""
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.replace(self.targets_file)  # whole files only: Prometheus re-reads it any time
        wanted = {g["targets"][0] for g in groups}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if wanted <= self._up():
                return
            time.sleep(0.5)
        raise TimeoutError(f"prometheus did not scrape {sorted(wanted - self._up())} within {timeout:g} s")

    def settle(self) -> None:
        """Long enough for two more scrapes: the last values are in before the pods go."""
        time.sleep(2.5 * SCRAPE_SECONDS)

    def _up(self) -> set[str]:
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/targets?state=active", timeout=5) as resp:
                active = json.loads(resp.read())["data"]["activeTargets"]
        except (OSError, ValueError, KeyError):
            return set()
        return {t["labels"]["instance"] for t in active if t.get("health") == "up"}

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        self._log.close()


@contextlib.contextmanager
def local_prometheus() -> Iterator[LocalPrometheus]:
    with tempfile.TemporaryDirectory(prefix="pdx-prometheus-") as root:
        prom = LocalPrometheus(Path(root))
        try:
            yield prom
        finally:
            prom.stop()
