#!/usr/bin/env python3
"""The long fuzz run (`make fuzz`), outside CI: each target of tests/fuzz, a million inputs by
default, in a plain seeded loop over the same generators and checks the tests run under
hypothesis (which would spend most of such a run in its own bookkeeping).

    .venv/bin/python scripts/fuzz.py [--execs N] [--targets front,wire,...] [--jobs J]
                                     [--seed S] [--coverage] [--out DIR]

An exec is one input through its target's check: the router's codec (whole, and again split
into the reads drawn) and both reference parsers, or the filter (whole and split), or the
shape checks. A failing input goes to DIR/<target>-<seed>-<n>.txt with its assertion, and the
run goes on. Per target: execs, seconds, execs/s, failures, and the allowed differences met.
--coverage: also measures line and branch coverage (coverage.py) of the targets' modules over
a shorter run (--coverage-execs, 20,000 a target) on the pure-Python modules (a compiled
module is opaque to coverage); the main run uses the compiled ones when their build is
current, and each row says which ran.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {  # what each target exercises, for --coverage
    "front": ["router/pdx_router/front.py", "router/pdx_router/wire.py"],
    "wire": ["router/pdx_router/wire.py"],
    "http1": ["operator/pdx/controller/http1.py"],
    "filter": ["router/pdx_router/filters.py"],
    "shapes": ["router/pdx_router/policy/shapes.py"],
}


def run(target: str, execs: int, seed: int, out: Path) -> dict[str, Any]:
    """One target's loop, in this process."""
    sys.path.insert(0, str(ROOT))
    from pdx_router import NATIVE
    from tests.fuzz import differ
    from tests.fuzz.draw import RandomDraw
    from tests.fuzz.targets import LAST, TARGETS

    check = TARGETS[target]
    rng = random.Random(seed)
    failures = 0
    t0 = time.perf_counter()
    for n in range(execs):
        try:
            check(RandomDraw(rng))
        except Exception as exc:  # an AssertionError, or a crash of the code under test
            failures += 1
            if failures <= 20:  # enough to go on with; the rest are counted
                (out / f"{target}-{seed}-{n}.txt").write_text(
                    f"target {target}, seed {seed}, exec {n}\ninput: {LAST!r}\n"
                    + "".join(traceback.format_exception(exc))[-20000:]
                )
    seconds = time.perf_counter() - t0
    return {"target": target, "seed": seed, "execs": execs, "seconds": seconds, "failures": failures,
            "rules": dict(differ.HITS), "router": NATIVE}  # fmt: skip


def coverage_of(target: str, execs: int, seed: int, out: Path) -> dict[str, Any]:
    """The target's line and branch coverage over `execs` inputs, pure Python."""
    os.environ["PDX_ROUTER_PURE"] = "1"
    import coverage

    cov = coverage.Coverage(branch=True, include=[str(ROOT / s) for s in SOURCES[target]], data_file=None)
    cov.start()
    result = run(target, execs, seed, out)
    cov.stop()
    report: dict[str, Any] = {}
    for source in SOURCES[target]:
        analysis = cov._analyze(str(ROOT / source))
        numbers = analysis.numbers
        report[source] = {
            "lines": f"{numbers.n_executed}/{numbers.n_statements}",
            "branches": f"{numbers.n_executed_branches}/{numbers.n_branches}",
            "percent": round(numbers.pc_covered, 1),
        }
    return {**result, "coverage": report}


def _job(args: tuple[str, str, int, int, str]) -> dict[str, Any]:
    kind, target, execs, seed, out = args
    return (coverage_of if kind == "coverage" else run)(target, execs, seed, Path(out))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--execs", type=int, default=1_000_000, help="inputs per target (default 1,000,000)")
    parser.add_argument("--targets", default="front,wire,http1,filter,shapes")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes; a target's execs are shared")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--coverage", action="store_true", help="and coverage, over --coverage-execs inputs a target")
    parser.add_argument("--coverage-execs", type=int, default=20_000)
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "fuzz")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    targets = args.targets.split(",")
    slices = max(1, args.jobs)
    jobs = [("run", t, args.execs // slices + (i < args.execs % slices), args.seed * 1000 + i, str(args.out))
            for t in targets for i in range(slices)]  # fmt: skip
    if args.coverage:
        jobs += [("coverage", t, args.coverage_execs, args.seed * 1000 + 999, str(args.out)) for t in targets]
    # A fresh process a job: the coverage jobs must import the pure modules, not the compiled.
    with multiprocessing.get_context("spawn").Pool(args.jobs, maxtasksperchild=1) as pool:
        results = pool.map(_job, jobs, chunksize=1)
    table: dict[str, Row] = {}
    for r in results:
        row = table.setdefault(str(r["target"]), Row())
        if "coverage" in r:
            row.coverage = r["coverage"]
            continue
        row.add(r)
    for name, row in table.items():
        figures = f"{row.execs:>10,} execs {row.cpu_seconds:8.0f} cpu-s {row.rate():>7,}/s"
        print(f"{name:7} {figures}  failures {row.failures}")
    summary = {
        name: {**asdict(row), "router": sorted(row.router), "execs_per_cpu_second": row.rate()}
        for name, row in table.items()
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    print(f"summary: {args.out / 'summary.json'}")
    return 1 if any(row.failures for row in table.values()) else 0


@dataclass
class Row:
    """One target's figures, summed over its processes."""

    execs: int = 0
    cpu_seconds: float = 0.0
    failures: int = 0
    rules: dict[str, int] = field(default_factory=dict)  # allowed differences met, by reference and rule
    coverage: object = None
    router: set[str] = field(default_factory=set)  # the data path that ran: compiled, or pure and why

    def add(self, result: dict[str, Any]) -> None:
        self.execs += int(result["execs"])
        self.cpu_seconds += float(result["seconds"])
        self.failures += int(result["failures"])
        self.router.add(str(result["router"]))
        for name, hits in result["rules"].items():
            self.rules[name] = self.rules.get(name, 0) + int(hits)

    def rate(self) -> int:
        return round(self.execs / self.cpu_seconds) if self.cpu_seconds else 0


if __name__ == "__main__":
    sys.exit(main())
