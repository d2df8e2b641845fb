"""Operator benchmark against kmock: event-to-children latency, and 500 resources reconciled.

Runs the real operator (`kopf run -A --standalone -m pdx.controller.handlers`, in a thread)
against kmock's Kubernetes emulator over loopback HTTP, the same setup as tests/operator, but
with kmock in a process of its own (scripts/kmock_server.py): in one process kmock took ~80% of
the GIL, so the figures measured the mock rather than the operator.

1. latency: create one DisaggregatedInference at a time and time from the POST to all 11
   children present (p50/p95 over N);
2. scale: create M resources at once and time until every child of every resource exists and
   every status reports its generation.

Each phase also reports CPU seconds: the operator's (this process, minus the thread driving the
bench) and kmock's (its process), in total and per resource.

Bounded: each phase stops at its deadline and reports what it reached.

    .venv/bin/python scripts/bench_operator.py [--latency-n 20] [--resources 500]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("PDX_RESYNC_SECONDS", "30")  # the timer is not what is measured
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import yaml
from kopf.testing import KopfRunner

from pdx.spec import API_VERSION, PLURAL
from tests.operator.conftest import cr_document

CHILDREN = 11  # what render() produces for 2P2D with one router
NS = "inference"
CLK_TCK = os.sysconf("SC_CLK_TCK")
ROOT = Path(__file__).resolve().parents[1]


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


@dataclass
class Cpu:
    """CPU seconds so far: this process, the bench's driver thread (this loop's), and kmock's.

    The operator's share is the process minus the driver thread: kopf runs in its own thread
    and its handler threads, while posting CRs and polling kmock happen on this one."""

    process: float
    driver: float
    kmock: float

    @classmethod
    def now(cls, kmock_pid: int) -> Cpu:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        fields = Path(f"/proc/{kmock_pid}/stat").read_text().rsplit(")", 1)[1].split()
        kmock_cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime
        return cls(ru.ru_utime + ru.ru_stime, time.thread_time(), kmock_cpu)

    def since(self, start: Cpu) -> tuple[float, float]:
        """(operator, kmock) CPU seconds between `start` and this sample."""
        return (self.process - start.process) - (self.driver - start.driver), self.kmock - start.kmock


def _cpu_rows(label: str, start: Cpu, end: Cpu, per: int) -> list[tuple[str, str]]:
    op, km = end.since(start)
    per_n = max(per, 1)
    return [
        (f"{label}: operator CPU", f"{op:.1f} s, {op / per_n * 1000:.0f} ms/resource (n={per})"),
        (f"{label}: kmock CPU", f"{km:.1f} s, {km / per_n * 1000:.0f} ms/resource"),
    ]


class Mock:
    """kmock in a child process (scripts/kmock_server.py) and an HTTP session to it."""

    def __init__(self, proc: asyncio.subprocess.Process, url: str, session: aiohttp.ClientSession) -> None:
        self.proc, self.url, self.session = proc, url, session

    @classmethod
    async def start(cls) -> Mock:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(ROOT / "scripts" / "kmock_server.py"),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        if not line.startswith("URL "):
            proc.kill()
            raise RuntimeError(f"kmock server did not start: {line!r}")
        return cls(proc, line.split()[1], aiohttp.ClientSession())

    async def stop(self) -> None:
        await self.session.close()
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # the server exits on EOF
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()

    async def post(self, name: str) -> None:
        url = f"{self.url}/apis/{API_VERSION}/namespaces/{NS}/{PLURAL}"
        async with self.session.post(url, json=cr_document(name=name)) as resp:
            assert resp.status < 300, await resp.text()

    async def state(self) -> dict[str, Any]:
        async with self.session.get(f"{self.url}/_bench/counts") as resp:
            data: dict[str, Any] = await resp.json()
        return data

    async def counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """Children per resource name, and observedGeneration per resource name."""
        data = await self.state()
        return data["children"], data["generations"]

    async def watched(self, plural: str, timeout: float) -> None:
        """Until the operator watches `plural`: kopf starts watching after its startup handlers."""
        end = time.monotonic() + timeout
        while plural not in (await self.state())["watched"]:
            if time.monotonic() > end:
                raise TimeoutError(f"the operator did not watch {plural} within {timeout:.0f} s")
            await asyncio.sleep(0.1)

    async def wait_children(self, name: str, n: int, timeout: float) -> int:
        """Long-poll: kmock answers once `name` has `n` children (it checks every 2 ms)."""
        params = {"name": name, "children": str(n), "timeout": str(max(timeout, 0.0))}
        async with self.session.get(f"{self.url}/_bench/wait", params=params) as resp:
            got: int = (await resp.json())["children"]
        return got


def _log(msg: str) -> None:
    """Progress on fd 2: click's runner swaps sys.stderr while the operator runs."""
    os.write(2, f"{msg}\n".encode())


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


async def bench(latency_n: int, resources: int, deadline: float) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    mock = await Mock.start()
    pid = mock.proc.pid
    try:
        import kubernetes.config.kube_config as kc

        kc.KUBE_CONFIG_DEFAULT_LOCATION = str(_kubeconfig(mock.url))
        runner = KopfRunner(["run", "-A", "--standalone", "-m", "pdx.controller.handlers"], timeout=60)
        runner.__enter__()
        try:
            t_start = time.monotonic()
            await mock.watched(PLURAL, 120)
            await asyncio.sleep(0.5)  # the watch's initial listing
            _log(f"operator started in {time.monotonic() - t_start:.1f}s; kmock pid {pid} at {mock.url}")
            # 1. latency
            lat: list[float] = []
            cpu0 = Cpu.now(pid)
            end = time.monotonic() + deadline
            for i in range(latency_n):
                name = f"lat-{i}"
                t0 = time.monotonic()
                await mock.post(name)
                await mock.wait_children(name, CHILDREN, end - time.monotonic())
                lat.append(time.monotonic() - t0)
                _log(f"latency {name}: {lat[-1]:.3f}s")
                if time.monotonic() >= end:
                    break
            await asyncio.sleep(1.0)  # let the status writes after the children land count too
            cpu1 = Cpu.now(pid)
            rows += [
                ("resources timed (latency)", f"{len(lat)}"),
                ("CR event -> all children applied, p50", f"{statistics.median(lat) * 1000:.0f} ms"),
                ("CR event -> all children applied, p95", f"{_pct(lat, 0.95) * 1000:.0f} ms"),
                ("CR event -> all children applied, max", f"{max(lat) * 1000:.0f} ms"),
                *_cpu_rows("latency phase", cpu0, cpu1, len(lat)),
            ]
            # 2. scale
            cpu0 = Cpu.now(pid)
            t0 = time.monotonic()
            end = t0 + deadline
            names = [f"bulk-{i}" for i in range(resources)]
            for chunk in range(0, resources, 50):
                await asyncio.gather(*(mock.post(n) for n in names[chunk : chunk + 50]))
            posted = time.monotonic() - t0
            _log(f"posted {resources} in {posted:.1f}s")
            done_children = done_status = None
            while time.monotonic() < end:
                kids, gens = await mock.counts()
                n_kids = sum(1 for n in names if kids.get(n, 0) >= CHILDREN)
                n_gens = sum(1 for n in names if n in gens)
                if done_children is None and n_kids == resources:
                    done_children = time.monotonic() - t0
                if n_gens == resources:
                    done_status = time.monotonic() - t0
                    break
                await asyncio.sleep(0.25)
            cpu1 = Cpu.now(pid)
            kids, gens = await mock.counts()
            with_kids = sum(1 for n in names if kids.get(n, 0) >= CHILDREN)
            full = sum(1 for n in names if kids.get(n, 0) >= CHILDREN and n in gens)
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
                ("resources with all children applied", f"{with_kids}/{resources}"),
                ("resources fully reconciled (children + status)", f"{full}/{resources}"),
            ]
            if done_status:
                rows.append(("throughput", f"{resources / done_status:.1f} resources/s"))
            else:
                rows.append(("throughput (reconciled / deadline)", f"{full / deadline:.1f} resources/s"))
            # Per fully reconciled resource: an upper bound when some were still in flight.
            rows += _cpu_rows(f"{resources} resources", cpu0, cpu1, full)
        finally:
            # Print before stopping: stopping kopf with hundreds of resources can take long.
            _print(rows)
            _log("stopping the operator")
            try:
                await asyncio.to_thread(runner.__exit__, None, None, None)
            except Exception as err:  # kopf's 60 s stop timeout, with hundreds of resources
                _log(f"operator stop: {err}")
            log = Path(tempfile.mkdtemp()) / "operator.log"
            log.write_text(runner.output)
            _log(f"stopped; operator log: {log}")
    finally:
        await mock.stop()
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
