"""End to end with real engines: vLLM (CPU build) prefill + decode over NIXL, the pdx router.

The topology is the embedded local CR, rendered by the operator's code and run by `pdx local`:
the same arguments a cluster would get. Engines run float32 with seeded random weights so
that greedy outputs are comparable and wrong KV would show. The conversations run once with
bidirectional off (the reference), then with it on.
"""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import statistics
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from pdx.local import default_document
from pdx.local.topology import LocalTopology, free_port
from pdx_contract import kv_prefix
from tests.e2e.chat import Answer, raw_turn
from tests.e2e.conversations import LONG, SCENARIOS
from tests.e2e.correctness import COMPARED, PLUGINS, Leg, converse, entry_points, judge, observe, router_stats, warm_up

pytest.importorskip("vllm", reason="needs the engine extra (scripts/setup.sh)")
pytestmark = [pytest.mark.engines, pytest.mark.timeout(1800)]

ROUTER_TTL = 20  # seconds: short, so that expiry can be waited out in a test
LONG_TTL = 300  # seconds: the router that sees an engine restart must keep its entries that long


def document(bidirectional: bool) -> dict[str, Any]:
    doc = copy.deepcopy(default_document())
    spec = doc["spec"]
    spec["model"]["name"] = "/models/pdx-tiny-w"  # seeded weights: wrong KV changes logits
    spec["model"].pop("loadFormat", None)
    spec["kvTransfer"]["bidirectional"] = bidirectional
    spec.setdefault("router", {})["conversationTtlSeconds"] = ROUTER_TTL  # keeps the CR's tokenizer: router
    return doc


@dataclass
class Run:
    """Turns per scenario, with prefill's reads, and what the topology said (correctness.Leg)."""

    leg: Leg

    @property
    def answers(self) -> dict[str, list[Answer]]:
        return self.leg.answers

    def reads(self, name: str, turn: int) -> float:
        """NIXL reads prefill counted during one turn."""
        return self.leg.turns[name][turn].reads


BY_HAND = ("blind", "as_given")
# Scenarios that restart an engine: last, in this order, because the others must not see it.
RESTARTS = ("prefill_killed", "decode_killed")


def run_all(
    topo: LocalTopology,
    before_turn: Callable[[str, int], None] | None = None,
    between: Callable[[], None] | None = None,
    routers: dict[str, str] | None = None,
) -> Run:
    """Every scenario, the long conversations, `between` (if any), then the engine restarts.

    `routers` sends a scenario to another router than the topology's (by name).
    """
    started = time.monotonic()
    warm_up(topo.router_url)
    prefill = topo.engine_urls["prefill"][0]
    # BY_HAND go through the router as the reference run; with `between`, they are done by hand.
    order = [n for n in SCENARIOS if n not in RESTARTS and not (between and n in BY_HAND)]
    scripts = {**{n: SCENARIOS[n] for n in order}, **LONG}
    turns = {name: converse(topo.router_url, prefill, name, script, before_turn) for name, script in scripts.items()}
    if between:
        between()
    for name in RESTARTS:
        router = (routers or {}).get(name, topo.router_url)
        turns[name] = converse(router, prefill, name, SCENARIOS[name], before_turn)
    return Run(observe(topo, turns, started))


@contextlib.contextmanager
def second_router(topo: LocalTopology, *flags: str) -> Iterator[str]:
    """The topology's router as a second process (its rendered config, these flags on top)."""
    rendered = topo.by_role("router")[0]
    port = free_port()
    argv = [*rendered.argv, "--port", str(port), *flags]
    with open(topo.log_path("router-second"), "ab") as log:
        proc = subprocess.Popen(
            argv, env={**os.environ, **rendered.env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, topo.log_tail("router-second")
            try:
                with urllib.request.urlopen(f"{url}/ready", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            assert time.monotonic() < deadline, "the second router did not become ready"
            time.sleep(0.2)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


@pytest.fixture(scope="module")
def off(tmp_path_factory: pytest.TempPathFactory) -> Run:
    with LocalTopology(document(bidirectional=False), state_dir=tmp_path_factory.mktemp("off")) as topo:
        return run_all(topo)


@dataclass
class OnRun(Run):
    killed: str = ""
    prefill_router_stats: dict[str, Any] | None = None
    blind: tuple[Answer, Answer] | None = None  # (turn 1, blind turn 2) by hand
    as_given: tuple[Answer, Answer] | None = None  # (turn 1, turn 2 on decode's params as they came)


@pytest.fixture(scope="module")
def on(off: Run, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OnRun]:
    topo = LocalTopology(document(bidirectional=True), state_dir=tmp_path_factory.mktemp("on"))
    # A prefill restart outlasts ROUTER_TTL: its scenario goes through a router whose entries live
    # longer, so that the turn after the restart finds decode's blocks still live.
    with topo, second_router(topo, "--conversation-ttl", str(LONG_TTL)) as long_lived:
        state: dict[str, Any] = {"killed": ""}

        def before_turn(name: str, i: int) -> None:
            if name == "expired" and i == 1:
                time.sleep(ROUTER_TTL + 2)
            if name == "prefill_killed" and i == 1:
                # Prefill's container dies and restarts (same pod, same UID): the new process
                # must be a new NIXL peer to decode, which still holds turn 0's blocks.
                pod = topo.by_role("prefill")[0].name
                topo.kill(pod)
                topo.restart(pod)
            if name == "decode_killed" and i == 1:
                # The decode that served turn 0 holds the entry: end it like a lost node, then
                # let its pod come back as Kubernetes would make it again. Its KV is gone.
                holder = topo.by_role("decode")[0].name
                topo.kill(holder)
                state["killed"] = holder
                topo.restart(holder)

        blind: list[tuple[Answer, Answer]] = []

        def blind_reuse() -> None:
            # By hand against the same engines: decode's parameters with what it holds named as
            # vLLM alone would (no check anywhere), then as they came (the engines check).
            prefill, decode = topo.engine_urls["prefill"][0], topo.engine_urls["decode"][0]
            for name in BY_HAND:
                first, held = raw_turn(prefill, decode, SCENARIOS[name][0]([]), None)
                if name == "blind":
                    named = held.pop(kv_prefix.HELD)
                    held = {**held, "remote_num_tokens": named["numTokens"]}
                second, _ = raw_turn(prefill, decode, SCENARIOS[name][1]([first]), held)
                blind.append((first, second))

        run = run_all(topo, before_turn, blind_reuse, {"prefill_killed": long_lived})
        yield OnRun(run.leg, state["killed"], router_stats(long_lived), blind[0], blind[1])


def test_later_turns_pull_kv_from_decode_instead_of_recomputing(on: OnRun) -> None:
    grow = on.answers["grow"]
    assert [a.reuse for a in grow] == ["miss", "hit", "hit"]
    # Decode held prompt + answer - 1 tokens of the previous turn; all of it matches.
    assert grow[1].reused_tokens == grow[0].prompt_tokens + len(grow[0].logprobs) - 1
    assert grow[2].reused_tokens == grow[1].prompt_tokens + len(grow[1].logprobs) - 1
    assert on.reads("grow", 1) >= 1 and on.reads("grow", 2) >= 1, "prefill's NIXL read counter did not move"
    stats = on.leg.router_stats
    assert stats["reuse"]["hit"] >= 2
    # The engines check the prefix themselves (the pdx plugin): the router asked nobody for
    # the prompts' ids, neither /tokenize nor its own tokenizer.
    assert stats["tokenizeMismatch"] == 0
    assert sum(stats["promptIds"].values()) == 0


def test_bidirectional_off_never_reuses(off: Run) -> None:
    assert {a.reuse for turns in off.answers.values() for a in turns} <= {"miss", "none", "expired"}


def test_greedy_outputs_with_reuse_equal_those_without_token_for_token(off: Run, on: OnRun) -> None:
    for name in COMPARED:
        for turn, (a_off, a_on) in enumerate(zip(off.answers[name], on.answers[name], strict=True)):
            assert a_on.token_ids and a_on.token_ids == a_off.token_ids, f"{name} turn {turn}"
            assert a_on.prompt_ids and a_on.prompt_ids == a_off.prompt_ids, f"{name} turn {turn}"
            assert max(abs(x - y) for x, y in zip(a_on.logprobs, a_off.logprobs, strict=True)) < 1e-4


def test_the_gpu_correctness_run_judges_these_cpu_engines_correct(off: Run, on: OnRun) -> None:
    """The checks scripts/gpu-correct.sh runs on a GPU, on this run: a check that fails on
    engines known to be right would fail the GPU run for nothing."""
    verdict = judge(off.leg, on.leg, tolerance=1e-4, loaded=entry_points())
    assert verdict.passed, verdict.failures
    assert verdict.figures["turnsEqual"] == verdict.figures["turnsCompared"] == 23
    # The CPU profile turns on every plugin: each engine log names all but the optional one.
    for engine, counts in verdict.figures["pluginLines"].items():
        assert all(counts[name] for name, p in PLUGINS.items() if not p.optional), (engine, counts)


def test_edited_truncated_or_stripped_history_reuses_only_the_common_prefix(on: OnRun) -> None:
    for name, turn in (("edited", 1), ("truncated", 2), ("stripped", 1)):
        answer = on.answers[name][turn]
        assert answer.reuse == "hit", name
        assert 64 <= answer.reused_tokens < answer.prompt_tokens - 1, (name, answer.reused_tokens)


def test_a_turn_with_too_little_in_common_is_recomputed(on: OnRun) -> None:
    answer = on.answers["diverged"][1]
    assert answer.reuse in ("prefix_mismatch", "below_threshold")
    assert answer.reused_tokens == 0
    assert on.reads("diverged", 1) == 0, "prefill read from decode anyway"
    assert on.reads("grow", 1) > 0, "no D->P read was ever counted"


def test_an_entry_past_its_ttl_is_served_by_recompute(on: OnRun) -> None:
    answer = on.answers["expired"][1]
    assert answer.reuse in ("expired", "miss")
    assert answer.reused_tokens == 0
    assert answer.text


def test_killing_the_decode_between_turns_still_answers_the_next_turn(off: Run, on: OnRun) -> None:
    assert on.killed
    answer = on.answers["decode_killed"][1]
    assert answer.reused_tokens == 0
    assert answer.tokens == off.answers["decode_killed"][1].tokens
    after = on.answers["decode_killed"][2]  # reuse resumes on the new decode
    assert after.reuse == "hit" and after.reused_tokens > 0, (after.reuse, after.reused_tokens)
    assert after.tokens == off.answers["decode_killed"][2].tokens


def test_a_prefill_restarted_between_turns_reads_the_kv_decode_still_holds(off: Run, on: OnRun) -> None:
    """With an engine id per pod, this restart failed every turn after it with NIXL_ERR_REMOTE_DISCONNECT."""
    first, next_turn, last = on.answers["prefill_killed"]
    assert first.reuse == "miss"
    # The new prefill reads all that decode held of turn 0 (it handshakes with decode afresh).
    assert next_turn.reuse == "hit", next_turn.reuse
    assert next_turn.reused_tokens == first.prompt_tokens + len(first.logprobs) - 1
    assert on.reads("prefill_killed", 1) >= 1, "the new prefill counted no read of decode's KV"
    assert last.reuse == "hit" and last.reused_tokens == next_turn.prompt_tokens + len(next_turn.logprobs) - 1
    assert on.reads("prefill_killed", 2) >= 1
    for turn, (a_off, a_on) in enumerate(zip(off.answers["prefill_killed"], on.answers["prefill_killed"], strict=True)):
        assert a_on.tokens == a_off.tokens, f"turn {turn}"
        assert max(abs(x - y) for x, y in zip(a_on.logprobs, a_off.logprobs, strict=True)) < 1e-4
    assert on.prefill_router_stats is not None
    assert on.prefill_router_stats["reuse"]["hit"] == 2 and on.prefill_router_stats["reuse"]["declined"] == 0


def test_ttft_of_the_last_long_turn_is_lower_with_bidirectional_on(off: Run, on: OnRun) -> None:
    # A comparison within one run, not a timing target: the effect is several-fold here.
    ttft_off = statistics.median(off.answers[f"long{k}"][-1].ttft_ms for k in range(3))
    ttft_on = statistics.median(on.answers[f"long{k}"][-1].ttft_ms for k in range(3))
    assert on.answers["long0"][-1].reuse == "hit"
    assert ttft_on < ttft_off, (ttft_on, ttft_off)


def test_blind_reuse_without_the_prefix_check_diverges_so_the_check_has_teeth(off: Run, on: OnRun) -> None:
    assert on.blind is not None
    first, blind = on.blind
    assert first.tokens == off.answers["blind"][0].tokens
    reference = off.answers["blind"][1]
    drift = max(abs(x - y) for x, y in zip(blind.logprobs, reference.logprobs, strict=True))
    assert blind.tokens != reference.tokens or drift > 1e-3, "wrong KV went unnoticed: the test has no teeth"


def test_decodes_params_passed_on_as_they_came_read_only_what_the_engines_checked(off: Run, on: OnRun) -> None:
    assert on.as_given is not None
    first, second = on.as_given
    assert first.tokens == off.answers["as_given"][0].tokens
    reference = off.answers["as_given"][1]
    assert second.tokens == reference.tokens
    assert max(abs(x - y) for x, y in zip(second.logprobs, reference.logprobs, strict=True)) < 1e-4
