"""Operator benchmark against kmock: event-to-children latency, and 500 resources reconciled.

Runs the real operator (`kopf run -A --standalone -m pdx.controller.handlers`, in a thread)
against kmock's Kubernetes emulator over loopback HTTP, the same setup as tests/operator:

1. latency: create one DisaggregatedInference at a time and time from the POST to all 11
   children present (p50/p95 over N);
2. scale: create M resources at once and time until every child of every resource exists and
   every status reports its generation.

Bounded: each phase stops at its deadline and reports what it reached.

    .venv/bin/python scripts/bench_operator.py [--latency-n 20] [--resources 500]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PDX_RESYNC_SECONDS", "30")  # the timer is not what is measured
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kmock
import yaml
from kopf.testing import KopfRunner

from pdx.spec import API_VERSION, PLURAL
from tests.operator.conftest import CHILD_RESOURCES, CR, ApiServer, cr_document, declare

CHILDREN = 11  # what render() produces for 2P2D with one router
NS = "inference"


def _kubeconfig(url: str) -> Path:
    path = Path(tempfile.mkdtemp()) / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "kmock", "cluster": {"server": url}}],
                "users": [{"name": "kmock", "user": {"token": "bench"}}],
                "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}],
                "current-context": "kmock",
            }
        )
    )
    return path


def _counts(api: ApiServer) -> tuple[dict[str, int], dict[str, int]]:
    """Children per resource name, and observedGeneration per resource name."""
    kids: dict[str, int] = {}
    gens: dict[str, int] = {}
    child_res = set(CHILD_RESOURCES.values())
    for (res, _ns, _name), obj in list(api.objects.items()):
        if obj.deleted:
            continue
        raw = obj.raw
        if res in child_res:
            inst = raw["metadata"]["labels"]["app.kubernetes.io/instance"]
            kids[inst] = kids.get(inst, 0) + 1
        elif res == CR:
            gen = (raw.get("status") or {}).get("observedGeneration")
            if gen is not None:
                gens[raw["metadata"]["name"]] = gen
    return kids, gens


async def _post(api: ApiServer, name: str) -> None:
    resp = await api.post(f"/apis/{API_VERSION}/namespaces/{NS}/{PLURAL}", json=cr_document(name=name))
    assert resp.status < 300, await resp.text()


def _log(msg: str) -> None:
    """Progress on fd 2: click's runner swaps sys.stderr while the operator runs."""
    os.write(2, f"{msg}\n".encode())


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


async def bench(latency_n: int, resources: int, deadline: float) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    async with ApiServer(history=64) as api, kmock.Server(api):
        declare(api)
        import kubernetes.config.kube_config as kc

        kc.KUBE_CONFIG_DEFAULT_LOCATION = str(_kubeconfig(str(api.url).rstrip("/")))
        runner = KopfRunner(["run", "-A", "--standalone", "-m", "pdx.controller.handlers"], timeout=60)
        runner.__enter__()
        # kmock's server shares the operator's process and kopf's log set-up: its per-request
        # access log lines (formatted and captured in memory) are harness cost, not operator cost.
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
        try:
            await asyncio.sleep(1.0)  # operator start-up and watches
            _log("operator started")
            # 1. latency
            lat: list[float] = []
            end = time.monotonic() + deadline
            for i in range(latency_n):
                name = f"lat-{i}"
                t0 = time.monotonic()
                await _post(api, name)
                while _counts(api)[0].get(name, 0) < CHILDREN and time.monotonic() < end:
                    await asyncio.sleep(0.002)
                lat.append(time.monotonic() - t0)
                _log(f"latency {name}: {lat[-1]:.3f}s")
                if time.monotonic() >= end:
                    break
            rows += [
                ("resources timed (latency)", f"{len(lat)}"),
                ("CR event -> all children applied, p50", f"{statistics.median(lat) * 1000:.0f} ms"),
                ("CR event -> all children applied, p95", f"{_pct(lat, 0.95) * 1000:.0f} ms"),
                ("CR event -> all children applied, max", f"{max(lat) * 1000:.0f} ms"),
            ]
            # 2. scale
            t0 = time.monotonic()
            end = t0 + deadline
            names = [f"bulk-{i}" for i in range(resources)]
            for chunk in range(0, resources, 50):
                await asyncio.gather(*(_post(api, n) for n in names[chunk : chunk + 50]))
            posted = time.monotonic() - t0
            _log(f"posted {resources} in {posted:.1f}s")
            done_children = done_status = None
            while time.monotonic() < end:
                kids, gens = _counts(api)
                n_kids = sum(1 for n in names if kids.get(n, 0) >= CHILDREN)
                n_gens = sum(1 for n in names if n in gens)
                if done_children is None and n_kids == resources:
                    done_children = time.monotonic() - t0
                if n_gens == resources:
                    done_status = time.monotonic() - t0
                    break
                await asyncio.sleep(0.25)  # each count walks every object in the mock
            kids, gens = _counts(api)
            rows += [
                (f"{resources} resources: all POSTed", f"{posted:.1f} s"),
                (
                    f"{resources} resources: all children applied",
                    f"{done_children:.1f} s" if done_children else f"timeout ({deadline:.0f} s)",
                ),
                (
                    f"{resources} resources: all statuses written",
                    f"{done_status:.1f} s" if done_status else f"timeout ({deadline:.0f} s)",
                ),
                ("resources fully reconciled", f"{sum(1 for n in names if kids.get(n, 0) >= CHILDREN)}/{resources}"),
            ]
            if done_status:
                rows.append(("throughput", f"{resources / done_status:.1f} resources/s"))
        finally:
            # Print before stopping: stopping kopf with hundreds of resources can take long.
            _print(rows)
            _log("stopping the operator")
            await asyncio.to_thread(runner.__exit__, None, None, None)
            _log("stopped")
    return rows


def _print(rows: list[tuple[str, str]]) -> None:
    if not rows:
        return
    width = max(len(k) for k, _ in rows)
    out = sys.__stdout__  # KopfRunner swaps sys.stdout while the operator runs
    print(f"{'metric':<{width}}  value", file=out)
    print(f"{'-' * width}  -----", file=out, flush=True)
    for k, v in rows:
        print(f"{k:<{width}}  {v}", file=out, flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--latency-n", type=int, default=20)
    p.add_argument("--resources", type=int, default=500)
    p.add_argument("--deadline", type=float, default=75.0, help="seconds per phase")
    args = p.parse_args()
    asyncio.run(bench(args.latency_n, args.resources, args.deadline))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
