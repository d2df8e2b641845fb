"""End to end with real engines: vLLM (CPU build) prefill + decode over NIXL, the pdx router.

The topology is the embedded local CR, rendered by the operator's code and run by `pdx local`:
the same arguments a cluster would get. Engines run float32 with seeded random weights so
that greedy outputs are comparable and wrong KV would show. The conversations run once with
bidirectional off (the reference), then with it on.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import statistics
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from pdx.local import default_document
from pdx.local.topology import LocalTopology, free_port
from pdx_contract import kv_prefix
from tests.e2e.chat import Answer, chat, metric, raw_turn

pytest.importorskip("vllm", reason="needs the engine extra (scripts/setup.sh)")
pytestmark = [pytest.mark.engines, pytest.mark.timeout(1800)]

ROUTER_TTL = 20  # seconds: short, so that expiry can be waited out in a test
LONG_TTL = 300  # seconds: the router that sees an engine restart must keep its entries that long
NIXL_XFERS = "vllm:nixl_xfer_time_seconds_count"

WORDS = [
    "agent",
    "plan",
    "tool",
    "call",
    "result",
    "file",
    "search",
    "query",
    "answer",
    "context",
    "memory",
    "step",
    "check",
    "build",
    "test",
    "deploy",
    "cluster",
    "node",
    "prefill",
    "decode",
    "cache",
    "block",
    "token",
    "stream",
    "request",
    "response",
    "error",
    "retry",
    "log",
    "metric",
]


def text(seed: int, n_words: int) -> str:
    """Deterministic filler prose of about n_words words."""
    return " ".join(WORDS[(seed * 7 + i * (seed % 5 + 3)) % len(WORDS)] for i in range(n_words))


SYSTEM = {"role": "system", "content": "You are a coding agent. " + text(1, 700)}


def user(i: int, n: int = 120) -> dict[str, str]:
    return {"role": "user", "content": f"Step {i}: " + text(i + 10, n)}


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
    """Answers per scenario and turn, from one topology."""

    answers: dict[str, list[Answer]]
    transfers: float = 0.0


def converse(url: str, name: str, turns: list[Any], on_turn: Any = None) -> list[Answer]:
    """Run a scripted conversation; each turn builds its messages from earlier answers."""
    answers: list[Answer] = []
    for i, build in enumerate(turns):
        if on_turn:
            on_turn(name, i)
        answers.append(chat(url, build(answers), conversation=name))
    return answers


def asst(a: Answer) -> dict[str, str]:
    return {"role": "assistant", "content": a.text}


def edited(step: int, spelled: str) -> list[Any]:
    """Turn 1, then turn 2 with turn 1's user message edited (its step number spelled out)."""
    return [
        lambda a: [SYSTEM, user(step)],
        lambda a: [
            SYSTEM,
            {"role": "user", "content": user(step)["content"].replace(f"Step {step}", f"Step {spelled}")},
            user(step + 1),
        ],
    ]


# Each scenario has its own steps: a prompt repeated verbatim in another conversation would be
# a full local prefix hit on decode, which in vLLM 0.32 (CPU) stalls until prefill's 30 s
# block lease expires (seen here before the fixes in docs/engine-notes.md) and would only slow the test.
SCENARIOS: dict[str, list[Any]] = {
    # The agent loop: the whole history plus a tool result and a new step each turn.
    "grow": [
        lambda a: [SYSTEM, user(1)],
        lambda a: [SYSTEM, user(1), asst(a[0]), user(2, 300)],
        lambda a: [SYSTEM, user(1), asst(a[0]), user(2, 300), asst(a[1]), user(3, 300)],
    ],
    # An earlier user message edited: only the system prompt is still decode's.
    "edited": edited(11, "eleven"),
    # History truncated: the first exchange dropped.
    "truncated": [
        lambda a: [SYSTEM, user(21)],
        lambda a: [SYSTEM, user(21), asst(a[0]), user(22)],
        lambda a: [SYSTEM, user(23)],
    ],
    # The answer's text stripped (as reasoning is stripped between turns: vLLM issue 43094).
    "stripped": [
        lambda a: [SYSTEM, user(31)],
        lambda a: [SYSTEM, user(31), {"role": "assistant", "content": a[0].text[len(a[0].text) // 2 :]}, user(32)],
    ],
    # Almost nothing in common: below the threshold, recomputed.
    "diverged": [
        lambda a: [SYSTEM, user(41)],
        lambda a: [{"role": "system", "content": "Different. " + text(3, 500)}, user(41)],
    ],
    # The next turn after the router's deadline.
    "expired": [lambda a: [SYSTEM, user(51)], lambda a: [SYSTEM, user(51), asst(a[0]), user(52)]],
    # The prefill container dies between turns and restarts in its pod (vLLM draws a new NIXL
    # engine id per process); decode still holds the conversation's blocks.
    "prefill_killed": [
        lambda a: [SYSTEM, user(81)],
        lambda a: [SYSTEM, user(81), asst(a[0]), user(82)],
        lambda a: [SYSTEM, user(81), asst(a[0]), user(82), asst(a[1]), user(83)],
    ],
    # The decode holding the KV dies between turns (and comes back, as its pod would).
    "decode_killed": [
        lambda a: [SYSTEM, user(61)],
        lambda a: [SYSTEM, user(61), asst(a[0]), user(62)],
        lambda a: [SYSTEM, user(61), asst(a[0]), user(62), asst(a[1]), user(63)],
    ],
    # Turn 1 as in "edited", for the blind-reuse probe (its own conversation by hand).
    "blind": edited(71, "seventy-one"),
    # The same, with decode's parameters passed on as they came (what any router does).
    "as_given": edited(75, "seventy-five"),
}
BY_HAND = ("blind", "as_given")


def long_conversation(k: int) -> list[Any]:
    """Three growing turns to about 4k tokens, for TTFT."""
    return [
        lambda a: [SYSTEM, user(100 + k, 400)],
        lambda a: [SYSTEM, user(100 + k, 400), asst(a[0]), user(200 + k, 400)],
        lambda a: [SYSTEM, user(100 + k, 400), asst(a[0]), user(200 + k, 400), asst(a[1]), user(300 + k, 400)],
    ]


# Scenarios that restart an engine: last, in this order, because the others must not see it.
RESTARTS = ("prefill_killed", "decode_killed")


def run_all(
    topo: LocalTopology, before_turn: Any = None, between: Any = None, routers: dict[str, str] | None = None
) -> Run:
    """Every scenario, the long conversations, `between` (if any), then the engine restarts.

    `routers` sends a scenario to another router than the topology's (by name).
    """
    chat(topo.router_url, [user(0)], conversation=None)  # warm up: NIXL handshake, first compile
    transfers0 = metric(topo.engine_urls["prefill"][0], NIXL_XFERS)
    # BY_HAND go through the router as the reference run; with `between`, they are done by hand.
    order = [n for n in SCENARIOS if n not in RESTARTS and not (between and n in BY_HAND)]
    answers = {name: converse(topo.router_url, name, SCENARIOS[name], before_turn) for name in order}
    for k in range(3):
        answers[f"long{k}"] = converse(topo.router_url, f"long{k}", long_conversation(k))
    transfers = metric(topo.engine_urls["prefill"][0], NIXL_XFERS) - transfers0
    if between:
        between()
    for name in RESTARTS:
        answers[name] = converse((routers or {}).get(name, topo.router_url), name, SCENARIOS[name], before_turn)
    return Run(answers, transfers)


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


def router_stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/v1/pdx/stats", timeout=10) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return doc


@pytest.fixture(scope="module")
def off(tmp_path_factory: pytest.TempPathFactory) -> Run:
    with LocalTopology(document(bidirectional=False), state_dir=tmp_path_factory.mktemp("off")) as topo:
        return run_all(topo)


@dataclass
class OnRun(Run):
    router_stats: dict[str, Any] | None = None
    killed: str = ""
    prefill_router_stats: dict[str, Any] | None = None
    transfers_by_turn: dict[tuple[str, int], float] | None = None
    blind: tuple[Answer, Answer] | None = None  # (turn 1, blind turn 2) by hand
    as_given: tuple[Answer, Answer] | None = None  # (turn 1, turn 2 on decode's params as they came)


@pytest.fixture(scope="module")
def on(off: Run, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OnRun]:
    topo = LocalTopology(document(bidirectional=True), state_dir=tmp_path_factory.mktemp("on"))
    # A prefill restart outlasts ROUTER_TTL: its scenario goes through a router whose entries live
    # longer, so that the turn after the restart finds decode's blocks still live.
    with topo, second_router(topo, "--conversation-ttl", str(LONG_TTL)) as long_lived:
        state: dict[str, Any] = {"killed": ""}
        transfers: dict[tuple[str, int], float] = {}

        def before_turn(name: str, i: int) -> None:
            transfers[(name, i)] = metric(topo.engine_urls["prefill"][0], NIXL_XFERS)
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
        transfers[("prefill_killed", 3)] = metric(topo.engine_urls["prefill"][0], NIXL_XFERS)
        stats, prefill_router_stats = router_stats(topo.router_url), router_stats(long_lived)
        yield OnRun(
            run.answers,
            run.transfers,
            stats,
            state["killed"],
            prefill_router_stats,
            transfers,
            blind[0],
            blind[1],
        )


def test_later_turns_pull_kv_from_decode_instead_of_recomputing(on: OnRun) -> None:
    grow = on.answers["grow"]
    assert [a.reuse for a in grow] == ["miss", "hit", "hit"]
    # Decode held prompt + answer - 1 tokens of the previous turn; all of it matches.
    assert grow[1].reused_tokens == grow[0].prompt_tokens + len(grow[0].logprobs) - 1
    assert grow[2].reused_tokens == grow[1].prompt_tokens + len(grow[1].logprobs) - 1
    assert on.transfers > 0, "prefill's NIXL transfer counter did not move"
    assert on.router_stats is not None and on.router_stats["reuse"]["hit"] >= 2
    # The engines check the prefix themselves (the pdx plugin): the router asked nobody for
    # the prompts' ids, neither /tokenize nor its own tokenizer.
    assert on.router_stats["tokenizeMismatch"] == 0
    assert sum(on.router_stats["promptIds"].values()) == 0


def test_bidirectional_off_never_reuses(off: Run) -> None:
    assert {a.reuse for turns in off.answers.values() for a in turns} <= {"miss", "none", "expired"}


def test_greedy_outputs_with_reuse_equal_those_without_token_for_token(off: Run, on: OnRun) -> None:
    for name in ("grow", "edited", "truncated", "stripped", "diverged", "long0", "long1", "long2"):
        for turn, (a_off, a_on) in enumerate(zip(off.answers[name], on.answers[name], strict=True)):
            assert a_on.tokens == a_off.tokens, f"{name} turn {turn}"
            assert max(abs(x - y) for x, y in zip(a_on.logprobs, a_off.logprobs, strict=True)) < 1e-4


def test_edited_truncated_or_stripped_history_reuses_only_the_common_prefix(on: OnRun) -> None:
    for name, turn in (("edited", 1), ("truncated", 2), ("stripped", 1)):
        answer = on.answers[name][turn]
        assert answer.reuse == "hit", name
        assert 64 <= answer.reused_tokens < answer.prompt_tokens - 1, (name, answer.reused_tokens)


def test_a_turn_with_too_little_in_common_is_recomputed(on: OnRun) -> None:
    answer = on.answers["diverged"][1]
    assert answer.reuse in ("prefix_mismatch", "below_threshold")
    assert answer.reused_tokens == 0
    by_turn = on.transfers_by_turn or {}
    assert by_turn[("expired", 0)] == by_turn[("diverged", 1)], "prefill read from decode anyway"
    assert by_turn[("diverged", 1)] > by_turn[("grow", 1)], "no D->P read was ever counted"


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
    by_turn = on.transfers_by_turn or {}
    assert by_turn[("prefill_killed", 2)] >= 1, "the new prefill counted no read of decode's KV"
    assert last.reuse == "hit" and last.reused_tokens == next_turn.prompt_tokens + len(next_turn.logprobs) - 1
    assert by_turn[("prefill_killed", 3)] > by_turn[("prefill_killed", 2)]
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
