"""The operator benchmark on the real control plane (issue 42), beside kmock's, in one run.

    .venv/bin/python scripts/bench_operator_cluster.py --resources 2000 [--edits 20] [--no-kmock] \
        [--workload-controllers off|on|both] [--baseline-src DIR [--rounds K]]

Up to three legs, one after the other on this machine, each printing its figures; then one table
(ratios only within it: this machine drifts 30-40% within minutes):

- kmock: `scripts/bench_operator.py`'s leg (the operator in a thread, kmock in its own process);
- controllers off: the same real kube-apiserver and etcd as below, with kube-controller-manager,
  kube-scheduler and kwok not started, so no pod, Endpoints or status write of a controller
  exists: the operator's own cost on the real API server, kmock's counterpart;
- controllers on: the control plane of tests/support/control_plane.py (built if needed; two p5en and one
  CPU kwok nodes), the chart installed with the built `helm`, and the operator as
  tests/cluster/test_user_flow.py runs it: the command of the chart's Deployment, as its own
  process, with a token of the chart's ServiceAccount. The same N DisaggregatedInferences
  (tests/operator's `cr_document`, 2P2D: 13 children each) are created with `kubectl create`
  (in 4 parallel streams); converged is every resource's status.observedGeneration 1 (written
  after all its children), and each one's 13 children are counted once at the end. The real
  controllers act too: each resource's StatefulSets and Deployment make pods (Pending: 4 GPU
  engines per resource do not fit two p5en nodes), and the operator's pod watch sees them.

`--baseline-src DIR` runs each cluster leg twice, first with the operator of DIR (a copy of an
older tree, through PYTHONPATH; and DIR's chart where DIR has `charts/pdx-operator`, for a change
to the chart's admission policy or RBAC), then this tree's: before/after side by side in one run.
`--rounds K` does that K times, in alternating order (baseline first in odd rounds), and prints
this tree over the baseline per figure: the median of the K rounds' ratios and their range.
One pair of legs is not enough for a change of a few percent: legs of one tree differed by 26%
within an hour here (2026-12-08).

Figures: seconds from the last create to all converged, the operator's CPU (its process, from
/proc) per resource over the converge phase, and CR edit latency (a TTL patch to
status.observedGeneration 2) p50/p95 over `--edits` resources, one at a time.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import os
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from pdx import labels  # noqa: E402
from pdx.spec import API_VERSION, PLURAL  # noqa: E402
from tests.operator.conftest import cr_document  # noqa: E402
from tests.support.control_plane import ControlPlane, build, cpu_node, p5en_node, wait_for  # noqa: E402
from tests.support.pdx_cluster import Helm, Operator  # noqa: E402

NS = "inference"
CHILDREN = 13
CLK_TCK = os.sysconf("SC_CLK_TCK")
Figures = dict[str, float]
CHILD_PATHS = (
    "/api/v1/namespaces/{ns}/services",
    "/apis/apps/v1/namespaces/{ns}/statefulsets",
    "/api/v1/namespaces/{ns}/configmaps",
    "/apis/apps/v1/namespaces/{ns}/deployments",
    "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
    "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
)


def _log(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


class Api:
    """GETs and PATCHes as the cluster's admin, over one TLS context."""

    def __init__(self, cp: ControlPlane) -> None:
        self.url = cp.url
        self.ctx = ssl.create_default_context(cafile=str(cp.ca))
        self.ctx.load_cert_chain(str(cp.pki.where / "admin.crt"), str(cp.pki.where / "admin.key"))

    def get(self, path: str, **params: str) -> Any:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        with urllib.request.urlopen(f"{self.url}{path}{'?' + query if query else ''}", context=self.ctx) as r:
            return json.loads(r.read())

    def merge_patch(self, path: str, body: dict[str, Any]) -> None:
        req = urllib.request.Request(
            f"{self.url}{path}", data=json.dumps(body).encode(), method="PATCH",
            headers={"Content-Type": "application/merge-patch+json"},
        )  # fmt: skip
        with urllib.request.urlopen(req, context=self.ctx) as r:
            r.read()


def _pprof(api: Api, seconds: int, out: Path) -> None:
    """The API server's Go CPU profile for `seconds` into `out` (read it: `go tool pprof -top
    BINARY out`)."""
    url = f"{api.url}/debug/pprof/profile?seconds={seconds}"
    with urllib.request.urlopen(url, context=api.ctx, timeout=seconds + 60) as r:
        out.write_bytes(r.read())
    _log(f"cluster: API server profile ({seconds} s) in {out}")


def _cpu(pid: int) -> float:
    return sum(_cpu_split(pid))


def _cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of a process (the kernel's share: syscalls, loopback TCP)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def _request_counts(api: Api) -> dict[str, float]:
    """The API server's apiserver_request_total, summed by verb, resource and subresource."""
    req = urllib.request.Request(f"{api.url}/metrics")
    with urllib.request.urlopen(req, context=api.ctx) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels_part, value = line[len("apiserver_request_total{") :].rsplit("} ", 1)
        tags = dict(kv.split("=", 1) for kv in labels_part.split('",') if "=" in kv)
        tags = {k: v.strip('"') for k, v in tags.items()}
        key = f"{tags.get('verb', '')} {tags.get('resource', '')}" + (
            f"/{tags['subresource']}" if tags.get("subresource") else ""
        )
        out[key] = out.get(key, 0.0) + float(value)
    return out


def _latencies(api: Api) -> dict[str, float]:
    """Mean seconds per request from the API server's histograms: handling by verb (APPLY,
    POST, ...), and queueing in API Priority and Fairness by priority level."""
    req = urllib.request.Request(f"{api.url}/metrics")
    with urllib.request.urlopen(req, context=api.ctx) as r:
        text = r.read().decode()
    sums: dict[str, float] = {}
    for line in text.splitlines():
        for metric, label in (
            ("apiserver_request_duration_seconds", "verb"),
            ("apiserver_flowcontrol_request_wait_duration_seconds", "priority_level"),
        ):
            for part in ("_sum{", "_count{"):
                if line.startswith(metric + part):
                    value = line.split(f'{label}="', 1)[1].split('"', 1)[0]
                    key = f"{'wait ' if 'flowcontrol' in metric else ''}{value}{part[:-1]}"
                    sums[key] = sums.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return sums


def _operator_passes(port: str | None) -> dict[str, float]:
    """The operator's pdx_operator_reconcile_passes_total by result (its PDX_METRICS_PORT)."""
    if not port:
        return {}
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("pdx_operator_reconcile_passes_total{"):
            result = line.split('result="', 1)[1].split('"', 1)[0]
            out[result] = float(line.rsplit(" ", 1)[1])
        elif line.startswith(("pdx_operator_reconcile_seconds_sum ", "pdx_operator_reconcile_seconds_count ")):
            out[line.split(" ", 1)[0].rsplit("_", 1)[1]] = float(line.rsplit(" ", 1)[1])
    return out


def _generations(api: Api) -> dict[str, int]:
    items = api.get(f"/apis/{API_VERSION}/namespaces/{NS}/{PLURAL}")["items"]
    return {i["metadata"]["name"]: (i.get("status") or {}).get("observedGeneration") or 0 for i in items}


class Generations:
    """Every CR's status.observedGeneration, from one watch of the CRs (a list, then a watch from
    its resourceVersion, again after the stream ends), so that waiting for convergence loads the
    API server with one watch instead of a list of every CR twice a second; `wait` blocks on it."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.observed: dict[str, int] = {}
        self.cond = threading.Condition()
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name="bench-watch", daemon=True)
        self.thread.start()

    def _set(self, item: dict[str, Any]) -> None:
        """A status whose pass failed to apply a child (Degraded, ApplyFailed) observed nothing yet."""
        name = item["metadata"]["name"]
        status = item.get("status") or {}
        failed = any(
            c.get("type") == "Degraded" and c.get("status") == "True" and c.get("reason") == "ApplyFailed"
            for c in status.get("conditions") or []
        )
        with self.cond:
            self.observed[name] = 0 if failed else status.get("observedGeneration") or 0
            self.cond.notify_all()

    def _run(self) -> None:
        path = f"/apis/{API_VERSION}/namespaces/{NS}/{PLURAL}"
        while not self.stopped:
            try:
                listing = self.api.get(path)
                for item in listing["items"]:
                    self._set(item)
                url = f"{self.api.url}{path}?watch=1&timeoutSeconds=3600&resourceVersion="
                url += listing["metadata"]["resourceVersion"]
                with urllib.request.urlopen(url, context=self.api.ctx) as stream:
                    for line in stream:
                        if self.stopped:
                            return
                        event = json.loads(line)
                        if event["type"] in ("ADDED", "MODIFIED"):
                            self._set(event["object"])
                        elif event["type"] == "ERROR":
                            break  # 410 Gone and the like: list again
            except (OSError, ValueError) as err:
                _log(f"watch of the CRs: {err}; again")
                time.sleep(0.5)

    def count(self, names: list[str], generation: int) -> int:
        with self.cond:
            return sum(1 for n in names if self.observed.get(n) == generation)

    def wait(self, names: list[str], generation: int, until: float) -> bool:
        """Until every one of `names` has observed `generation` (True), or time.monotonic() >= until."""
        with self.cond:
            while any(self.observed.get(n) != generation for n in names):
                left = until - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True


def _children(api: Api) -> dict[str, int]:
    """Children per instance, all kinds (metadata only would do; the full list is read once)."""
    out: dict[str, int] = {}
    selector = f"{labels.MANAGED_BY}={labels.MANAGER}"
    for path in CHILD_PATHS:
        for item in api.get(path.format(ns=NS), labelSelector=selector)["items"]:
            instance = item["metadata"]["labels"].get(labels.INSTANCE, "")
            out[instance] = out.get(instance, 0) + 1
    return out


def cluster_leg(
    resources: int,
    edits: int,
    deadline: float,
    py_spy: str | None = None,
    logs: str | None = None,
    controllers: bool = True,
    src: Path | None = None,
    pprof: str | None = None,
) -> tuple[list[tuple[str, str]], Figures]:
    """One leg on a fresh control plane: its table rows, and the figures `round_ratios` compares.
    `controllers` False: etcd and the API server only; `src` a checkout whose operator runs
    instead of this tree's (through PYTHONPATH)."""
    rows: list[tuple[str, str]] = []
    figures: Figures = {}
    cp = ControlPlane(build(), workload_controllers=controllers, apiserver_profiling=pprof is not None)
    cp.start()
    try:
        if controllers:  # without kwok no node goes Ready, and nothing would schedule onto one
            cp.add_nodes(p5en_node("p5en-0"), p5en_node("p5en-1"), cpu_node("cpu-0"))
        helm = Helm(cp)
        chart = ROOT / "charts" / "pdx-operator"
        if src is not None and (src / "charts" / "pdx-operator").is_dir():
            chart = src / "charts" / "pdx-operator"  # the baseline's admission policy and RBAC too
        helm("install", "pdx-operator", str(chart), "-n", "pdx-system", "--create-namespace")
        deployment = cp.get("deployment", "pdx-operator", "-n", "pdx-system")
        kubeconfig = cp.service_account_kubeconfig("pdx-system", "pdx-operator", seconds=7200)
        operator = Operator.from_deployment(cp, deployment, kubeconfig)
        operator.env["PDX_RESYNC_SECONDS"] = "30"  # the chart's default; the timer is not what is measured
        if src is not None:
            operator.env["PYTHONPATH"] = os.pathsep.join(str(src / d) for d in ("operator", "contract"))
        if os.environ.get("PDX_WORKERS"):
            operator.env["PDX_WORKERS"] = os.environ["PDX_WORKERS"]
        cp.kubectl("create", "namespace", NS)
        if controllers:  # the ServiceAccount controller makes it; without it no pod is made that needs it
            wait_for(
                "ServiceAccount default",
                lambda: cp.kubectl("get", "sa", "default", "-n", NS, check=False).returncode == 0,
            )
        operator.start()
        assert operator.proc is not None
        pid = operator.proc.pid
        api = Api(cp)
        names = [f"bulk-{i}" for i in range(resources)]
        streams = 4
        files = []
        tmp = Path(tempfile.mkdtemp(prefix="pdx-bench-"))
        for s in range(streams):
            path = tmp / f"crs-{s}.yaml"
            path.write_text(yaml.safe_dump_all([cr_document(name=n) for n in names[s::streams]]))
            files.append(path)
        _log(f"cluster: up in {cp.started_in:.1f} s; operator pid {pid}; creating {resources}")
        components = cp.pids
        parts0 = {name: _cpu(p) for name, p in components.items()}
        requests0 = _request_counts(api)
        latencies0 = _latencies(api)
        metrics_port = operator.env.get("PDX_METRICS_PORT")
        profiler = None
        if py_spy:
            out = Path(py_spy)
            profiler = subprocess.Popen(
                [os.environ.get("PY_SPY", "py-spy"), "record", "-p", str(pid), "-f", "raw", "-r", "100",
                 *os.environ.get("PY_SPY_FLAGS", "--gil").split(), "--threads", "-o", str(out)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        pprofiler = None
        if pprof:  # the API server's CPU profile over the creates and the converge's start
            seconds = int(os.environ.get("PDX_PPROF_SECONDS", "20"))
            pprofiler = threading.Thread(target=_pprof, args=(api, seconds, Path(pprof)), daemon=True)
            pprofiler.start()
        watched = Generations(api)
        cpu0 = _cpu_split(pid)
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(streams) as pool:
            list(pool.map(lambda f: cp.kubectl("create", "-f", str(f), "-o", "name", timeout=deadline), files))
        created = time.monotonic() - t0
        _log(f"cluster: created {resources} in {created:.1f} s")
        done = time.monotonic() - t0 if watched.wait(names, 1, t0 + deadline) else None
        cpu1 = _cpu_split(pid)
        parts1 = {name: _cpu(p) for name, p in components.items()}
        if pprofiler is not None:
            pprofiler.join()
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)
            profiler.wait(60)
        requests1 = _request_counts(api)
        latencies1 = _latencies(api)
        passes = _operator_passes(metrics_port)
        gens = _generations(api)
        kids = _children(api)
        full = [n for n in names if gens.get(n) == 1 and kids.get(n, 0) >= CHILDREN]
        _log(f"cluster: converged {len(full)}/{resources} at {time.monotonic() - t0:.1f} s")
        pods = len(api.get(f"/api/v1/namespaces/{NS}/pods", labelSelector=f"{labels.NAME}={labels.APP}")["items"])
        if done and len(full) == resources:  # a leg that did not converge has no figure to compare
            figures = {
                "last create -> all converged (s)": done - created,
                "operator CPU (ms/resource)": (sum(cpu1) - sum(cpu0)) / resources * 1000,
                "kube-apiserver CPU (s)": parts1["kube-apiserver"] - parts0["kube-apiserver"],
            }
        rows += [
            ("all created", f"{created:.1f} s"),
            ("last create -> all converged", f"{done - created:.1f} s" if done else f"timeout ({deadline:.0f} s)"),
            ("converged (children + status)", f"{len(full)}/{resources}"),
            (
                "converge: operator CPU",
                f"{sum(cpu1) - sum(cpu0):.1f} s, {(sum(cpu1) - sum(cpu0)) / max(len(full), 1) * 1000:.0f} ms/resource",
            ),
            ("converge: operator CPU, user / system", f"{cpu1[0] - cpu0[0]:.1f} s / {cpu1[1] - cpu0[1]:.1f} s"),
            ("pods the real controllers made", str(pods)),
            (
                "converge: control plane CPU",
                ", ".join(f"{name} {parts1[name] - parts0[name]:.1f} s" for name in components),
            ),
            ("converge: API requests (all clients)", f"{sum(requests1.values()) - sum(requests0.values()):.0f}"),
        ]
        if passes:
            rows.append(
                (
                    "converge: operator passes",
                    ", ".join(f"{k} {passes.get(k, 0):.0f}" for k in ("wrote", "idle", "failed", "invalid"))
                    + f"; {passes.get('sum', 0) / max(passes.get('count', 0), 1) * 1000:.0f} ms each on average",
                )
            )
        diff = {k: v - requests0.get(k, 0.0) for k, v in requests1.items()}
        top = sorted(diff.items(), key=lambda kv: -kv[1])[:25]
        _log("cluster: API requests while converging: " + ", ".join(f"{k} {v:.0f}" for k, v in top))
        mean = {
            k[: -len("_sum")]: (latencies1[k] - latencies0.get(k, 0.0))
            / max(
                latencies1.get(k[: -len("_sum")] + "_count", 0.0) - latencies0.get(k[: -len("_sum")] + "_count", 0.0),
                1.0,
            )
            for k in latencies1
            if k.endswith("_sum")
        }
        _log(
            "cluster: mean seconds per request while converging: "
            + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in sorted(mean.items()))
        )
        lat: list[float] = []
        for n in full[:edits]:
            cr_path = f"/apis/{API_VERSION}/namespaces/{NS}/{PLURAL}/{n}"
            t1 = time.monotonic()
            api.merge_patch(cr_path, {"spec": {"kvTransfer": {"decoderKvBlocksTtlSeconds": 1200}}})
            if watched.wait([n], 2, t1 + 30):
                lat.append(time.monotonic() - t1)
        if lat:
            rows += [
                (f"CR edit -> all children, p50 (n={len(lat)})", f"{statistics.median(lat) * 1000:.0f} ms"),
                ("CR edit -> all children, p95", f"{_pct(lat, 0.95) * 1000:.0f} ms"),
            ]
        rows.append(("CR edits done within 30 s", f"{len(lat)}/{min(edits, len(full))}"))
        watched.stopped = True
        operator.stop()
        if logs:
            Path(logs).mkdir(parents=True, exist_ok=True)
            shutil.copy(operator.log_path, Path(logs) / "operator.log")
            for log in (cp.workdir / "logs").glob("*.log"):
                shutil.copy(log, Path(logs) / log.name)
    finally:
        cp.stop()
    return rows, figures


def round_ratios(rounds: list[tuple[Figures, Figures]]) -> dict[str, tuple[float, float, float]]:
    """Per figure, this tree over the baseline in each round: (median, lowest, highest). The two
    legs of a round ran back to back, so their ratio holds up where the machine's drift between
    rounds (30-40% within minutes here) swamps any single leg; a round missing a figure is left out."""
    out: dict[str, tuple[float, float, float]] = {}
    for name in dict.fromkeys(k for base, this in rounds for k in (*base, *this)):
        ratios = [this[name] / base[name] for base, this in rounds if base.get(name) and name in this]
        if ratios:
            out[name] = (statistics.median(ratios), min(ratios), max(ratios))
    return out


def kmock_leg(resources: int, edits: int, deadline: float) -> list[tuple[str, str]]:
    spec = importlib.util.spec_from_file_location("bench_operator", ROOT / "scripts" / "bench_operator.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_operator"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    args = argparse.Namespace(
        resources=resources, deadline=deadline, window=35.0, edits=edits, settle=2.0, baseline_deadline=None,
        pin="0,1" if len(os.sched_getaffinity(0)) >= 2 else "none",
    )  # fmt: skip
    rows: list[tuple[str, str]] = module._leg(args, None)
    return rows


def _counts_in_values(rows: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A metric's " (n=K)" moves into its value, so that legs with different counts share a row."""
    out = []
    for key, value in rows:
        if key.endswith(")") and " (n=" in key:
            key, count = key[:-1].rsplit(" (n=", 1)
            value = f"{value} (n={count})"
        out.append((key, value))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--resources", type=int, default=2000)
    p.add_argument("--edits", type=int, default=20)
    p.add_argument("--deadline", type=float, default=600.0, help="seconds to converge, at most (each leg)")
    p.add_argument("--no-kmock", action="store_true", help="the cluster legs only")
    p.add_argument(
        "--workload-controllers",
        choices=("off", "on", "both"),
        default="both",
        help="the real API server without kube-controller-manager, kube-scheduler and kwok (off), with them (on), "
        "or both legs (default)",
    )
    p.add_argument(
        "--baseline-src",
        type=Path,
        help="a checkout whose operator runs each cluster leg first, beside this tree's (PYTHONPATH); its "
        "charts/pdx-operator too, where it has one",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="with --baseline-src: this many rounds of the baseline's leg and this tree's, back to back, in "
        "alternating order, then this tree over the baseline per round (median, range)",
    )
    p.add_argument("--logs", metavar="DIR", help="copy the operator's and the components' logs here at the end")
    p.add_argument(
        "--py-spy",
        metavar="FILE",
        help="record the operator with py-spy (`$PY_SPY` or on PATH; flags `$PY_SPY_FLAGS`, default --gil) while "
        "converging: FILE.off, FILE.on",
    )
    p.add_argument(
        "--apiserver-pprof",
        metavar="FILE",
        help="the API server's Go CPU profile over the first $PDX_PPROF_SECONDS (default 20) s of each cluster "
        "leg's creates and converge: FILE.off, FILE.on",
    )
    args = p.parse_args()
    if args.rounds < 1 or (args.rounds > 1 and args.baseline_src is None):
        p.error(f"--rounds {args.rounds}: rounds compare the baseline with this tree: give --baseline-src DIR, "
                "or leave --rounds at 1")  # fmt: skip
    legs: dict[str, list[tuple[str, str]]] = {}
    if not args.no_kmock:
        _log(f"kmock leg, {args.resources} resources")
        legs["kmock"] = kmock_leg(args.resources, args.edits, args.deadline)
        _log(f"kmock: {legs['kmock']}")
    compared: dict[str, list[tuple[Figures, Figures]]] = {}
    for mode in ("off", "on") if args.workload_controllers == "both" else (args.workload_controllers,):
        for r in range(args.rounds):
            srcs = (args.baseline_src.resolve(), None) if args.baseline_src else (None,)
            got: dict[bool, Figures] = {}
            for src in srcs if r % 2 == 0 else srcs[::-1]:  # ABBA: neither tree always runs first
                mark = f" #{r + 1}" if args.rounds > 1 else ""
                leg = f"controllers {mode}" + (", baseline" if src else "") + mark
                tag = mode + ("-baseline" if src else "") + (f"-{r + 1}" if args.rounds > 1 else "")
                _log(f"cluster leg, {leg}, {args.resources} resources")
                legs[leg], got[src is not None] = cluster_leg(
                    args.resources,
                    args.edits,
                    args.deadline,
                    f"{args.py_spy}.{tag}" if args.py_spy else None,
                    f"{args.logs}/{tag}" if args.logs else None,
                    controllers=mode == "on",
                    src=src,
                    pprof=f"{args.apiserver_pprof}.{tag}" if args.apiserver_pprof else None,
                )
            if args.baseline_src:
                compared.setdefault(mode, []).append((got[True], got[False]))
    legs = {leg: _counts_in_values(rows) for leg, rows in legs.items()}
    keys: list[str] = []
    for rows in legs.values():
        keys += [k for k, _ in rows if k not in keys]
    width = max(len(k) for k in keys)
    print(f"N = {args.resources}")
    print(f"| {'metric':<{width}} | " + " | ".join(legs) + " |")
    print(f"|{'-' * (width + 2)}|" + "|".join("-" * (len(k) + 2) for k in legs) + "|")
    for k in keys:
        print(f"| {k:<{width}} | " + " | ".join(dict(rows).get(k, "-") for rows in legs.values()) + " |", flush=True)
    for mode, rounds in compared.items():
        print(f"\nthis tree / baseline, controllers {mode}, {len(rounds)} round(s): median (lowest-highest)")
        for name, (median, low, high) in round_ratios(rounds).items():
            print(f"- {name}: {median:.3f} ({low:.3f}-{high:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
