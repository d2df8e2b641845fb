"""One scripted run of every GPU figure of a wave (issues 43 and 45): `pdx bench wave OUT`.

A GPU machine is lent for at most 25 minutes, reached through 10-minute calls, and each engine
start costs 90-150 s on it. So the run is planned (`plan`, pure: parts, legs, an estimate of
each, the budget arithmetic) and then driven on as few engine starts as the figures allow:

1. the seed sweep's OFF leg (OFF engines), then its ON leg and bound (ON engines): the headline
   figures, complete first;
2. on the ON engines, every other part's ON-side legs (ON and the bound; D->P and decode-local
   with background streams, which change only router fields): each part's ON figures are
   written and packed as they end;
3. on OFF engines, every other part's OFF leg: each part completed, written and packed again;
4. on the engines of prefill's first token (decode's logits processor), the legs that need them.

Four starts of the benchmark's engines in all, where part after part OFF then ON would take
thirteen. Every part's texts have a seed of their own, so engines kept from one part never hold
another's prompts. Before each leg the driver checks its estimate against the time left and
skips a leg that would not fit (`wave.json` says so); `correct` (scripts/gpu-correct.sh, its
own CR and engines) is run by scripts/gpu-wave.sh after this, its time reserved in the plan.

Each part lands in OUT/<part>/ (the usual `pdx bench` outputs: records, report.md,
summary.json, the processes' logs) and OUT/<part>.tgz; `wave.json` and `wave.log` say what ran,
when, its estimate and what it took. `pdx bench wave-report OUT` writes OUT/report.md: every
part's headline table, and the sweep beside the seed article's p5en figures.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import tarfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .background import BackgroundSpec
from .sweep import (
    BOUND_LEGS,
    Endpoints,
    Leg,
    LegResult,
    LocalTarget,
    SweepConfig,
    TopologyFactory,
    engines_see,
    run_sweep,
    with_changes,
)
from .workload import AGENTIC, SuffixMix, TokenCounter, WorkloadSpec

OFF = Leg("off", (("kvTransfer.bidirectional", False),))
ON = Leg("on", (("kvTransfer.bidirectional", True),))
DP = Leg("dp", (("kvTransfer.bidirectional", True), ("router.decodeLocalMaxTokens", 0)))
# The D->P path with the client's first token prefill's (router.firstTokenFromPrefill): decode's
# logits processor is an engine argument, so its own engines (one more start).
DP_FIRST = Leg("dp-first", (*DP.changes, ("router.firstTokenFromPrefill", True)))
# ON as it would ship with the switch on: on dp-first's engines (only router fields differ).
ON_FIRST = Leg("on-first", (*ON.changes, ("router.firstTokenFromPrefill", True)))
# ON with decode's holds shortened under pressure (`PDX_HELD_KV_SHORTEN=1`; whole is the default,
# pdx_engine.held_kv.shorten_from_env): what shortening changes at the overcommit point. Its own
# engines (an engine setting): one more start.
SHORTENED = Leg("on-shortened", (("kvTransfer.bidirectional", True), ("decode.env.PDX_HELD_KV_SHORTEN", "1")))
CORRECT = "correct"  # scripts/gpu-correct.sh: run by the shell script, its time reserved here
CORRECT_WHAT = "scripts/gpu-correct.sh: greedy output ON == OFF on the seeded model, edited histories, plugins"


@dataclass(frozen=True)
class Costs:
    """What the estimate counts with, per profile. GPU: the H100 run of 2026-12-05
    (docs/results/h100-2026-12-05-held: OFF's 32.7k-token turn 1,293 ms p50, so 0.04 s per
    thousand prompt tokens computed; gpu-correct.sh 122 s) and the H100 waves of 2026-12-06
    (docs/results/h100-2026-12-06d-wave, -06e-wave: the first legs ready after 124 and 170 s, both
    engines starting at once; every later start 84-90 s, vLLM's compile cache then warm). Fitted
    on 2026-12-07 to the waves 06h (H200), 07b and 07f (H100), first starts ready after 131-155 s
    and later ones after 63-85 s: with these costs their legs took 0.59-1.05x their estimates
    (1,145 s against 1,360), and 0.69-1.19x in the next wave (docs/results/h100-2026-12-07h-wave)."""

    engine_start_s: float  # the wave's first start
    engine_restart_s: float  # every later one
    per_ktok_s: float  # prefill compute per thousand prompt tokens
    tpot_s: float  # per answer token
    request_s: float  # per request beyond compute: HTTP, the router, the engines' scrapes
    correct_s: float
    warmup_s: float
    bound_share: float = 1.0  # the bound's run over its ON leg's (sent straight to decode: no hops)

    def start_s(self, earlier: int) -> float:
        """An engine start's estimate, after `earlier` starts in the same run."""
        return self.engine_start_s if earlier == 0 else self.engine_restart_s


GPU_COSTS = Costs(
    engine_start_s=160.0,
    engine_restart_s=90.0,
    per_ktok_s=0.04,
    tpot_s=0.010,
    request_s=0.08,
    correct_s=150.0,
    warmup_s=2.0,
    bound_share=0.4,
)
CPU_COSTS = Costs(
    engine_start_s=60.0, engine_restart_s=60.0, per_ktok_s=0.5, tpot_s=0.03, request_s=0.3, correct_s=0.0, warmup_s=5.0
)

# The machine's 25 minutes less what is not the wave: the machine start (~90 s), four staging
# calls and the install (~60 s), the calls that collect results (~30 s).
MACHINE_S = 25 * 60
OUTSIDE_S = 180


@dataclass(frozen=True)
class Part:
    """One figure of the wave: a `pdx bench` sweep (lengths x points x legs), its seed its own."""

    name: str
    what: str
    legs: tuple[Leg, ...]
    lengths: tuple[int, ...]
    spec: WorkloadSpec
    suffixes: tuple[int, ...] = ()
    live: tuple[int, ...] = ()
    bound: bool = True
    background: BackgroundSpec | None = None
    whole: bool = False  # runs complete, in its own leg order, before any other part (the headline)

    def config(self, legs: Sequence[Leg] | None = None) -> SweepConfig:
        return SweepConfig(
            lengths=list(self.lengths),
            spec=self.spec,
            legs=list(self.legs if legs is None else legs),
            bound=self.bound,
            suffixes=list(self.suffixes),
            live=list(self.live),
            background=self.background,
        )

    def estimate_s(self, leg: Leg, costs: Costs) -> float:
        """Seconds the leg's requests take (the bound's too): compute serialized on the engines,
        answers spread over the clients, think times per conversation."""
        cfg = self.config([leg])
        total = costs.warmup_s
        for point in cfg.points():
            spec = cfg.spec.with_prefix(point.length)
            spec = spec if point.suffix is None else spec.with_new_tokens(point.suffix)
            spec = spec if point.live is None else spec.live(point.live)
            clients = min(spec.concurrency, spec.conversations)
            new = _mean_new_tokens(spec)
            # Live conversations on their own prefixes are the overcommit point: decode cannot keep
            # them all, so ON recomputes most follow-ups there (counted as OFF: an over-estimate).
            reuses = _reuses(leg) and point.live is None
            compute = 0.0
            for turn in range(1, spec.turns + 1):
                history = spec.prefix_tokens + (turn - 1) * (new + spec.output_tokens)
                computed = history + new if (turn == 1 or not reuses) else new
                compute += computed / 1000 * costs.per_ktok_s
            per_conv = spec.turns * (costs.request_s + spec.output_tokens * costs.tpot_s)
            think = (spec.turns - 1) * spec.think_time_s
            seconds = (
                spec.conversations * compute + (spec.conversations * per_conv + spec.conversations * think) / clients
            )
            runs = 1 + (costs.bound_share if (self.bound and leg.name in BOUND_LEGS) else 0.0)
            total += runs * seconds
        return total


def _reuses(leg: Leg) -> bool:
    return dict(leg.changes).get("kvTransfer.bidirectional", True) is not False


def _engines(leg: Leg) -> str:
    """What of the leg the engines see (`sweep.engines_see`, as the local target compares legs): legs
    alike run on the same engines, and a leg unlike the one before starts them."""
    return json.dumps(engines_see(with_changes({}, leg.changes)), sort_keys=True)


def _mean_new_tokens(spec: WorkloadSpec) -> float:
    """A follow-up turn's new tokens on average (a mix's: its buckets' log-uniform means)."""
    mix = spec.suffix_mix
    if mix is None:
        return float(spec.user_tokens + spec.tool_tokens)
    total = sum(b.weight for b in mix.buckets)
    return sum(b.weight / total * (b.high - b.low) / math.log(b.high / b.low) for b in mix.buckets)


@dataclass(frozen=True)
class Step:
    """One leg of one part on the engines it needs; `start`: the engines change before it."""

    part: str
    leg: Leg
    start: bool
    estimate_s: float


@dataclass(frozen=True)
class Plan:
    profile: str
    parts: tuple[Part, ...]
    costs: Costs
    budget_s: float  # for the driver and correct together
    correct: bool = True

    def part(self, name: str) -> Part:
        return next(p for p in self.parts if p.name == name)

    def steps(self) -> list[Step]:
        """The legs in the order they run: a whole part's (the sweep's) in its own order, then every
        other part's legs on the engines running, then on each other set of engines, in the order
        the parts first ask for them (two starts for a subset without the sweep and with ON and
        OFF legs, whatever its parts' leg orders)."""
        if not self.parts:
            return []
        order: list[tuple[str, Leg]] = [(p.name, leg) for p in self.parts if p.whole for leg in p.legs]
        rest = [(p.name, leg) for p in self.parts if not p.whole for leg in p.legs]
        running_first = _engines((order or rest)[-1 if order else 0][1])
        kinds = list(dict.fromkeys([running_first, *(_engines(leg) for _, leg in rest)]))
        order += [s for kind in kinds for s in rest if _engines(s[1]) == kind]
        out: list[Step] = []
        running: str | None = None
        for name, leg in order:
            engines = _engines(leg)
            out.append(Step(name, leg, engines != running, self.part(name).estimate_s(leg, self.costs)))
            running = engines
        return out

    def starts(self) -> int:
        return sum(1 for s in self.steps() if s.start)

    def estimate_s(self) -> float:
        """Every step, every engine start of the benchmark's topology, and correct's reserve."""
        legs = sum(s.estimate_s for s in self.steps())
        return legs + sum(self.costs.start_s(k) for k in range(self.starts())) + self.reserve_s

    @property
    def reserve_s(self) -> float:
        """gpu-correct.sh's two starts, and a third where the part `first` runs (FIRST_TOKEN=1)."""
        if not self.correct:
            return 0.0
        return self.costs.correct_s * (1.5 if any(p.name == "first" for p in self.parts) else 1.0)

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "budget_s": self.budget_s,
            "estimate_s": round(self.estimate_s()),
            "engine_starts": self.starts(),
            "engine_start_s": self.costs.engine_start_s,
            "engine_restart_s": self.costs.engine_restart_s,
            "correct_reserve_s": self.reserve_s,
            "parts": [{"name": p.name, "what": p.what, "legs": [leg.name for leg in p.legs]} for p in self.parts]
            + (
                [{"name": CORRECT, "what": "scripts/gpu-correct.sh: greedy ON == OFF", "legs": []}]
                if self.correct
                else []
            ),
            "steps": [
                {"part": s.part, "leg": s.leg.name, "engine_start": s.start, "estimate_s": round(s.estimate_s, 1)}
                for s in self.steps()
            ],
        }


def _parts_gpu() -> tuple[Part, ...]:
    base = WorkloadSpec(turns=4, conversations=3)
    return (
        # Five conversations, not three: ON's first turn over OFF's (target 1.03x) moved 0.96-1.05x
        # between H100 runs on three first turns a length (docs/results/h100-2026-12-06c-first-turns).
        Part("sweep", "the seed's sweep to 32k, OFF, ON and the bound (the held-KV valve on: the default)",
             (OFF, ON), (2000, 8000, 16000, 24000, 32000), replace(base, conversations=5, seed=0), whole=True),
        Part("suffix2k", "2k-token suffixes at 12k and 20k: ON (an idle decode takes them) and the D->P path, "
             "each over the bound", (ON, DP, OFF),
             (12000, 20000), replace(base, seed=1), suffixes=(2000,)),
        Part("agentic", f"the agentic mix at 16k ({AGENTIC.describe()})",
             (ON, OFF), (16000,), replace(base, turns=5, conversations=6, seed=2, suffix_mix=AGENTIC)),
        # The D->P path with the client's first token prefill's (router.firstTokenFromPrefill), beside
        # the D->P path and ON's bound, on 2k-token suffixes. Before tpot, whose dp-first leg runs on
        # the same engines after this part's (a wave short of time skips it first), and before
        # overcommit, whose optional on-shortened starts engines after both.
        Part("first", "2k-token suffixes at 12k and 20k through prefill, the first token decode's and prefill's, "
             "over the bound; ON with the switch too", (ON, DP, DP_FIRST, ON_FIRST), (12000, 20000),
             replace(base, seed=6), suffixes=(2000,)),
        # dp-first: the same D->P turns and streams with prefill's first token, whose logits processor
        # puts vLLM 0.26's decode on its V1 model runner: the streams' TPOT under the switch.
        Part("tpot", "decode-local at the default threshold against D->P, 3 streams decoding: their TPOT; "
             "D->P with prefill's first token too", (DP, Leg("local", (("kvTransfer.bidirectional", True),)), DP_FIRST),
             (16000,),
             replace(base, turns=5, conversations=4, seed=3), suffixes=(512, 1024), bound=False,
             background=BackgroundSpec(3, 128, 512)),
        Part("load", "8 clients, 16 conversations at 16k, OFF and ON",
             (ON, OFF), (16000,), replace(base, conversations=16, concurrency=8, seed=4), bound=False),
        Part("overcommit", "12 live conversations of their own 16k prefix: about 2x decode's KV, the valve's point "
             "(ON with holds shortened too with PARTS naming shortened)", (ON, SHORTENED, OFF), (16000,),
             replace(base, think_time_s=2.0, shared_prefix=False, seed=5),
             live=(12,), bound=False),
    )  # fmt: skip


CPU_MIX = SuffixMix.parse("16-64:0.6,64-256:0.3,256-513:0.1")


def _parts_cpu() -> tuple[Part, ...]:
    """The same parts at the CPU engines' scale: the control flow, not the figures."""
    base = WorkloadSpec(turns=3, conversations=2, user_tokens=16, tool_tokens=48, output_tokens=8)
    local = Leg("local", (("kvTransfer.bidirectional", True), ("router.decodeLocalMaxTokens", 128)))
    return (
        Part("sweep", "the sweep, OFF, ON and the bound", (OFF, ON), (256, 1024), replace(base, seed=0), whole=True),
        Part("suffix2k", "long suffixes: ON and D->P over the bound", (ON, DP, OFF), (512,),
             replace(base, seed=1), suffixes=(256,)),
        Part("agentic", f"the mix {CPU_MIX.describe()}", (ON, OFF), (512,),
             replace(base, turns=4, conversations=3, seed=2, suffix_mix=CPU_MIX)),
        Part("first", "long suffixes through prefill, the first token decode's and prefill's, over the bound",
             (ON, DP, DP_FIRST, ON_FIRST), (512,), replace(base, seed=6), suffixes=(256,)),
        Part("tpot", "decode-local against D->P with a stream, and D->P with prefill's first token",
             (DP, local, DP_FIRST), (512,), replace(base, seed=3), suffixes=(32,), bound=False,
             background=BackgroundSpec(1, 16, 64)),
        Part("load", "2 clients", (ON, OFF), (512,), replace(base, conversations=4, concurrency=2, seed=4),
             bound=False),
        Part("overcommit", "3 live conversations of their own prefix (ON with shortened holds too when asked)",
             (ON, SHORTENED, OFF), (1024,),
             replace(base, think_time_s=1.0, shared_prefix=False, seed=5), live=(3,), bound=False),
    )  # fmt: skip


PART_NAMES = ("sweep", "suffix2k", "agentic", "first", "tpot", "load", "overcommit")
# Run only when named (PARTS=...): overcommit's ON leg with shortened holds, an engine setting (one
# more start) measured beside the default; the default wave's plan fits the budget without it.
OPTIONAL_PARTS = ("shortened",)


def plan(profile: str = "gpu", parts: Sequence[str] | None = None, budget_s: float | None = None) -> Plan:
    """The wave for `profile` (gpu, cpu), its parts in order of importance (`parts`: a subset,
    `correct` among them or not), within `budget_s` (default: the machine's 25 minutes less what
    is spent outside the wave)."""
    every = _parts_gpu() if profile == "gpu" else _parts_cpu()
    wanted = list(parts) if parts is not None else [*PART_NAMES, CORRECT]
    known = (*PART_NAMES, *OPTIONAL_PARTS, CORRECT)
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ValueError(f"unknown parts {', '.join(unknown)}: the wave has {', '.join(known)}")
    if "shortened" in wanted and "overcommit" not in wanted:
        raise ValueError("the part shortened is a leg of overcommit: name both (PARTS=overcommit,shortened)")
    chosen = tuple(_without_shortened(p) if "shortened" not in wanted else p for p in every if p.name in wanted)
    costs = GPU_COSTS if profile == "gpu" else CPU_COSTS
    budget = budget_s if budget_s is not None else float(MACHINE_S - OUTSIDE_S)
    return Plan(profile, chosen, costs, budget, correct=CORRECT in wanted and profile == "gpu")


def _without_shortened(part: Part) -> Part:
    return replace(part, legs=tuple(leg for leg in part.legs if leg is not SHORTENED))


# ------------------------------------------------------------------------------------ the run


def wave_document(document: dict[str, Any], decode_blocks: int | None) -> dict[str, Any]:
    """The wave's resource: decode's KV fixed at `decode_blocks` (the H100's 796 blocks of 128 by
    default: the same pressure on an H200 or on a GPU of its own), bidirectional on."""
    doc = copy.deepcopy(document)
    if decode_blocks:
        decode = doc.setdefault("spec", {}).setdefault("decode", {})
        args = [a for a in decode.get("extraArgs", [])]
        if "--num-gpu-blocks-override" in args:
            i = args.index("--num-gpu-blocks-override")
            del args[i : i + 2]
        decode["extraArgs"] = [*args, "--num-gpu-blocks-override", str(decode_blocks)]
    return with_changes(doc, [("kvTransfer.bidirectional", True)])


class _Kept:
    """The local target across parts: a part's sweep ends without stopping the engines."""

    def __init__(self, target: LocalTarget) -> None:
        self.target = target
        self.description = target.description

    def serve(self, leg: Any) -> Any:
        return self.target.serve(leg)

    def close(self) -> None:
        pass


@dataclass
class _PartView:
    """What write_outputs reads of a target, for one part's legs."""

    description: str
    start_seconds: dict[str, float] = field(default_factory=dict)
    router_only: list[str] = field(default_factory=list)
    peak_rss_mib: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class _Progress:
    results: dict[str, list[LegResult]] = field(default_factory=dict)
    views: dict[str, _PartView] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # per part: its legs' time, starts included
    steps: list[dict[str, Any]] = field(default_factory=list)


def run(
    wave: Plan,
    document: dict[str, Any],
    out: Path,
    counter_for: Callable[[Endpoints], TokenCounter],
    *,
    factory: TopologyFactory | None = None,
    state_dir: Path | None = None,
    clock: Callable[[], float] = time.monotonic,
    log_dirs: Callable[[], Iterator[Path]] | None = None,
) -> int:
    """Drive the plan's steps on one local target; write and pack each part as its legs end.
    Exit 0 when every step ran and no request failed, 1 otherwise (skipped steps included)."""
    from .cli import write_outputs

    out.mkdir(parents=True, exist_ok=True)
    target = LocalTarget(document, state_dir, factory=factory)
    kept = _Kept(target)
    began = clock()
    deadline = began + wave.budget_s - wave.reserve_s
    progress = _Progress()
    status: dict[str, Any] = {"plan": wave.to_json(), "steps": progress.steps}
    steps = wave.steps()
    rc = 0
    try:
        for i, step in enumerate(steps):
            part = wave.part(step.part)
            start_s = wave.costs.start_s(sum(s.start for s in steps[:i])) if step.start else 0.0
            need = step.estimate_s + start_s
            entry: dict[str, Any] = {"part": step.part, "leg": step.leg.name, "estimate_s": round(need, 1)}
            progress.steps.append(entry)
            if clock() + need > deadline:
                entry["skipped"] = f"{need:.0f} s estimated, {max(0.0, deadline - clock()):.0f} s left"
                _log(out, f"{step.part} {step.leg.name}: skipped ({entry['skipped']})")
                rc = 1
                continue
            _log(out, f"{step.part} {step.leg.name}: start (estimate {need:.0f} s)")
            t0 = clock()
            started_wall = time.time()
            try:
                results = run_sweep(kept, part.config([step.leg]), counter_for)
            except Exception as err:  # a leg that cannot run: the next may on fresh engines
                entry["error"] = repr(err)[:500]
                _log(out, f"{step.part} {step.leg.name}: failed: {err!r}"[:300])
                target.close()
                rc = 1
                continue
            took = clock() - t0
            entry["seconds"] = round(took, 1)
            entry["engines_kept"] = step.leg.name in target.router_only
            view = progress.views.setdefault(step.part, _PartView(target.description))
            view.start_seconds[step.leg.name] = target.start_seconds.get(step.leg.name, 0.0)
            if entry["engines_kept"]:
                view.router_only.append(step.leg.name)
            target.router_only.clear()
            view.peak_rss_mib[step.leg.name] = target.peak_rss_mib.get(step.leg.name, {})
            progress.results.setdefault(step.part, []).extend(results)
            progress.seconds[step.part] = progress.seconds.get(step.part, 0.0) + took
            ran = {(s["leg"]) for s in progress.steps if s["part"] == step.part and "seconds" in s}
            ran_legs = [leg for leg in part.legs if leg.name in ran]
            complete = len(ran_legs) == len(part.legs)
            last_of_part = not any(s.part == step.part for s in steps[i + 1 :])
            done = ", ".join(leg.name for leg in ran_legs)
            code = write_outputs(
                progress.results[step.part],
                view,
                part.config(ran_legs),
                out / step.part,
                started_wall + took - progress.seconds[step.part],
                extra_context={"wave part": f"{part.name}: {part.what}", "wave legs run": done},
            )
            rc = rc or (code if complete or last_of_part else 0)
            _copy_logs(out / step.part, log_dirs)
            if part.name == "tpot":  # once dp and local ran, whether or not dp-first fits after them
                _decode_local(out / step.part, part)
            entry["complete"] = complete
            _pack(out, step.part)
            partial = "" if complete else f" (partial: {done})"
            _log(out, f"{step.part} {step.leg.name}: exit {code} after {took:.0f} s; packed {step.part}.tgz{partial}")
            (out / "wave.json").write_text(json.dumps(status, indent=2) + "\n")
    finally:
        target.close()
        status["seconds"] = round(clock() - began, 1)
        (out / "wave.json").write_text(json.dumps(status, indent=2) + "\n")
    _log(out, f"wave: exit {rc} after {clock() - began:.0f} s")
    return rc


def _log(out: Path, line: str) -> None:
    with (out / "wave.log").open("a") as f:
        f.write(f"== {time.strftime('%H:%M:%S')} {line}\n")


def _copy_logs(dest: Path, log_dirs: Callable[[], Iterator[Path]] | None) -> None:
    for logs in log_dirs() if log_dirs is not None else ():
        if logs.is_dir():
            shutil.copytree(logs, dest / "logs", dirs_exist_ok=True)


def _decode_local(run_dir: Path, part: Part) -> None:
    from . import decodelocal

    names = [leg.name for leg in part.legs]
    if (run_dir / f"records-{names[0]}.json").is_file() and (run_dir / f"records-{names[1]}.json").is_file():
        decodelocal.write_report(run_dir, names[0], names[1])


def _pack(out: Path, part: str) -> Path:
    """OUT/<part>.tgz, written beside and renamed: a collecting call never reads half a file."""
    tmp = out / f".{part}.tgz"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(out / part, arcname=part)
        for name in ("wave.json", "wave.log", "gpu.txt"):
            if (out / name).is_file():
                tar.add(out / name, arcname=f"{part}/{name}")
    final = out / f"{part}.tgz"
    tmp.replace(final)
    return final
