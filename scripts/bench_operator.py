"""Operator benchmark against kmock: N resources converged, steady-state requests, CR edits.

Runs the real operator (`kopf run -A --standalone -m pdx.controller.handlers`, in a thread)
against kmock's Kubernetes emulator over loopback HTTP, the same setup as tests/operator, with
kmock in a process of its own (scripts/kmock_server.py): in one process kmock took ~80% of the
GIL, so the figures measured the mock rather than the operator.

One leg, for N resources:

1. converge: POST N DisaggregatedInferences (50 at a time) and time from the first POST until
   every one has all its children and a status with its generation;
2. steady: with nothing changing, count the API requests kmock serves over a window longer
   than the resync interval (one timer pass per resource), watches apart;
3. edit: change the spec of K converged resources one at a time and time from the PATCH to
   status.observedGeneration of the new generation (written after all its children).

Each phase reports CPU seconds: the operator's (this process, minus the thread driving the
bench) and kmock's (its process). Bounded: converging stops at its deadline and reports what
it reached. `--pin OP,MOCK` (default 0,1 on two or more CPUs; `none` to share) runs the leg's
process on CPU OP and kmock on CPU MOCK, so the mock's CPU never takes the operator's core
(both may still share theirs with whatever else runs on the machine).

`--baseline-src DIR` runs the same leg twice, side by side in one run, each in its own
process: first the operator from DIR (a checkout of an older revision, through PYTHONPATH),
then this tree's, and prints both columns. The mock, the CRs and this script are this tree's.

    .venv/bin/python scripts/bench_operator.py --resources 500 [--baseline-src /tmp/pdx-base]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
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

CHILDREN = 13  # what render() produces for 2P2D with one router (tests/operator EXPECTED)
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
    async def start(cls, cpu: int | None = None) -> Mock:
        pin = [] if cpu is None else [f"--cpu={cpu}"]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(ROOT / "scripts" / "kmock_server.py"), *pin,
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

    async def patch(self, name: str, patch: dict[str, Any]) -> None:
        url = f"{self.url}/apis/{API_VERSION}/namespaces/{NS}/{PLURAL}/{name}"
        headers = {"Content-Type": "application/merge-patch+json"}
        async with self.session.patch(url, json=patch, headers=headers) as resp:
            assert resp.status < 300, await resp.text()

    async def requests(self) -> dict[str, Any]:
        async with self.session.get(f"{self.url}/_bench/requests") as resp:
            data: dict[str, Any] = await resp.json()
        return data

    async def wait_generation(self, name: str, generation: int, timeout: float) -> int | None:
        """Long-poll: kmock answers once `name`'s status.observedGeneration is `generation`."""
        params = {"name": name, "generation": str(generation), "timeout": str(timeout)}
        async with self.session.get(f"{self.url}/_bench/wait", params=params) as resp:
            got: int | None = (await resp.json())["generation"]
        return got

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


async def _steady_requests(mock: Mock, window: float) -> tuple[int, int, str]:
    """(requests, watch requests, the three most frequent kinds) kmock served in `window` s."""
    before = await mock.requests()
    await asyncio.sleep(window)
    after = await mock.requests()
    by = {k: n - before["by"].get(k, 0) for k, n in after["by"].items()}
    top = ", ".join(f"{k} {n}" for k, n in sorted(by.items(), key=lambda kv: -kv[1])[:3] if n)
    return after["total"] - before["total"], after["watches"] - before["watches"], top or "-"


def _passes_now() -> dict[str, float]:
    """The operator's reconcile passes so far by result (its metrics; none in older trees)."""
    try:
        from pdx.controller import metrics
    except ImportError:
        return {}
    samples = (s for m in metrics.PASSES.collect() for s in m.samples)
    return {s.labels["result"]: s.value for s in samples if s.name.endswith("_total")}


def _passes(before: dict[str, float], after: dict[str, float], n: int) -> str:
    if not after:
        return "-"
    by = {k: v - before.get(k, 0.0) for k, v in after.items()}
    return ", ".join(f"{k} {v / max(n, 1):.2f}" for k, v in sorted(by.items(), key=lambda kv: -kv[1]) if v)


def _per_resource(before: dict[str, Any], after: dict[str, Any], n: int) -> str:
    """The requests kmock served between two read-outs, per resource POSTed, the most frequent first
    (the bench's own POSTs of the CRs included: 1 per resource)."""
    by = {k: v - before["by"].get(k, 0) for k, v in after["by"].items()}
    total = after["total"] - before["total"] - (after["watches"] - before["watches"])
    top = ", ".join(f"{k} {v / n:.1f}" for k, v in sorted(by.items(), key=lambda kv: -kv[1])[:12] if v)
    return f"{total / max(n, 1):.1f} ({top})"


def _pins(spec: str) -> tuple[int, int] | None:
    """(operator CPU, kmock CPU) from "OP,MOCK", or None for "none"."""
    if spec == "none":
        return None
    op, mock = (int(x) for x in spec.split(","))
    return op, mock


async def bench(
    resources: int, deadline: float, window: float, edits: int, settle: float, pins: tuple[int, int] | None = None
) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    if pins is not None:
        os.sched_setaffinity(0, {pins[0]})  # this thread, before kopf's and the passes' start: they inherit it
        rows.append(("cores", f"operator on CPU {pins[0]}, kmock on CPU {pins[1]}"))
    mock = await Mock.start(None if pins is None else pins[1])
    pid = mock.proc.pid
    try:
        import kubernetes.config.kube_config as kc

        import pdx.controller.handlers as handlers

        # No router answers here; both legs skip the stats call alike.
        handlers.fetch_router_stats = lambda url: None
        kc.KUBE_CONFIG_DEFAULT_LOCATION = str(_kubeconfig(mock.url))
        runner = KopfRunner(["run", "-A", "--standalone", "-m", "pdx.controller.handlers"], timeout=60)
        runner.__enter__()
        try:
            t_start = time.monotonic()
            await mock.watched(PLURAL, 120)
            await asyncio.sleep(0.5)  # the watch's initial listing
            _log(f"operator started in {time.monotonic() - t_start:.1f}s; kmock pid {pid} at {mock.url}")
            # 1. converge
            cpu0 = Cpu.now(pid)
            served0 = await mock.requests()
            passes0 = _passes_now()
            t0 = time.monotonic()
            end = t0 + deadline
            names = [f"bulk-{i}" for i in range(resources)]
            for chunk in range(0, resources, 50):
                await asyncio.gather(*(mock.post(n) for n in names[chunk : chunk + 50]))
            posted = time.monotonic() - t0
            _log(f"posted {resources} in {posted:.1f}s")
            done = None
            while time.monotonic() < end:
                kids, gens = await mock.counts()
                if sum(1 for n in names if kids.get(n, 0) >= CHILDREN and n in gens) == resources:
                    done = time.monotonic() - t0
                    break
                await asyncio.sleep(0.25)
            cpu1 = Cpu.now(pid)
            served1 = await mock.requests()
            kids, gens = await mock.counts()
            full = [n for n in names if kids.get(n, 0) >= CHILDREN and n in gens]
            _log(f"converged {len(full)}/{resources} at {time.monotonic() - t0:.1f}s")
            rows += [
                ("all POSTed", f"{posted:.1f} s"),
                ("first POST -> all converged", f"{done:.1f} s" if done else f"timeout ({deadline:.0f} s)"),
                ("last POST -> all converged", f"{done - posted:.1f} s" if done else "-"),
                ("converged (children + status)", f"{len(full)}/{resources}"),
            ]
            # Per converged resource: an upper bound when some were still in flight.
            rows += _cpu_rows("converge", cpu0, cpu1, len(full))
            rows.append(("converge: requests per resource, by kind", _per_resource(served0, served1, resources)))
            rows.append(("converge: passes per resource, by result", _passes(passes0, _passes_now(), resources)))
            # 2. steady
            await asyncio.sleep(settle)
            cpu0 = Cpu.now(pid)
            total, watches, top = await _steady_requests(mock, window)
            cpu1 = Cpu.now(pid)
            op, km = cpu1.since(cpu0)
            rows += [
                (f"steady: API requests/s beyond watches ({window:.0f} s)", f"{(total - watches) / window:.2f}"),
                ("steady: most frequent requests", top),
                ("steady: operator CPU", f"{op / window * 100:.0f}% of a core"),
                ("steady: kmock CPU", f"{km / window * 100:.0f}% of a core"),
            ]
            # 3. edit
            lat: list[float] = []
            stop_edits = time.monotonic() + 60.0  # a backlogged operator could take each 30 s
            for n in full[:edits]:
                t1 = time.monotonic()
                await mock.patch(n, {"spec": {"kvTransfer": {"decoderKvBlocksTtlSeconds": 1200}}})
                if await mock.wait_generation(n, 2, 30.0) == 2:
                    lat.append(time.monotonic() - t1)
                if time.monotonic() > stop_edits:
                    break
            if lat:
                rows += [
                    (f"CR edit -> all children, p50 (n={len(lat)})", f"{statistics.median(lat) * 1000:.0f} ms"),
                    ("CR edit -> all children, p95", f"{_pct(lat, 0.95) * 1000:.0f} ms"),
                ]
        finally:
            # The figures first: a backlogged kopf may never stop (the parent reads this line).
            print(json.dumps(rows), file=sys.__stdout__, flush=True)
            _log("stopping the operator")
            # kopf may not stop at all with a backlog of thousands; the leg exits anyway (a
            # daemon thread: asyncio.run would wait for an executor's).
            stopper = threading.Thread(target=runner.__exit__, args=(None, None, None), daemon=True)
            stopper.start()
            for _ in range(300):
                if not stopper.is_alive():
                    break
                await asyncio.sleep(0.1)
            else:
                _log("the operator did not stop within 30 s")
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


def _leg(args: argparse.Namespace, src: Path | None) -> list[tuple[str, str]]:
    """One leg in a process of its own: the operator from `src` (None: this tree)."""
    path = os.pathsep.join(str((src or ROOT) / d) for d in ("operator", "router", "contract", "engine"))
    env = {**os.environ, "PYTHONPATH": path}
    deadline = args.baseline_deadline if src and args.baseline_deadline else args.deadline
    cmd = [sys.executable, __file__, "--leg", *_shared(args), f"--deadline={deadline}"]
    _log(f"leg {'baseline ' + str(src) if src else 'this tree'}: {' '.join(cmd)}")
    limit = deadline + args.settle + args.window + 180  # converge, steady, edits (60 s), stops
    try:
        out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, timeout=limit).stdout
    except subprocess.TimeoutExpired as err:  # it printed its figures before stopping kopf
        out = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
    lines = [line for line in out.splitlines() if line.startswith("[")]
    return [(k, v) for k, v in json.loads(lines[-1])] if lines else [("leg", "no figures")]


def _shared(args: argparse.Namespace) -> list[str]:
    return [f"--resources={args.resources}", f"--deadline={args.deadline}", f"--window={args.window}",
            f"--edits={args.edits}", f"--settle={args.settle}", f"--pin={args.pin}"]  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--resources", type=int, default=500)
    p.add_argument("--deadline", type=float, default=150.0, help="seconds to converge, at most")
    p.add_argument("--window", type=float, default=35.0, help="steady-state window (> PDX_RESYNC_SECONDS)")
    p.add_argument("--edits", type=int, default=20)
    p.add_argument("--baseline-src", type=Path, help="a checkout whose operator is the baseline leg")
    p.add_argument("--baseline-deadline", type=float, help="the baseline leg's --deadline (one that never converges)")
    p.add_argument("--settle", type=float, default=2.0, help="seconds from convergence to the steady window")
    p.add_argument(
        "--pin",
        default="0,1" if len(os.sched_getaffinity(0)) >= 2 else "none",
        help="OP,MOCK: the operator's CPU and kmock's, or none (default 0,1 on two or more CPUs)",
    )
    p.add_argument("--leg", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.leg:
        asyncio.run(bench(args.resources, args.deadline, args.window, args.edits, args.settle, _pins(args.pin)))
        os._exit(0)  # not waiting for an operator thread that did not stop
    if args.baseline_src is None:
        _print(_leg(args, None))
        return 0  # a leg's kopf that did not stop is in its own process, gone with it
    base = _leg(args, args.baseline_src.resolve())
    new = _leg(args, None)
    _print_side_by_side(base, new, args.resources)
    return 0


def _print_side_by_side(base: list[tuple[str, str]], new: list[tuple[str, str]], n: int) -> None:
    old = dict(base)
    keys = [k for k, _ in new] + [k for k, _ in base if k not in dict(new)]
    width = max(len(k) for k in keys)
    print(f"N = {n}")
    print(f"| {'metric':<{width}} | baseline | this tree |")
    print(f"|{'-' * (width + 2)}|----------|-----------|")
    for k in keys:
        print(f"| {k:<{width}} | {old.get(k, '-')} | {dict(new).get(k, '-')} |", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
