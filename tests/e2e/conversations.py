"""Scripted multi-turn conversations for real engines: the e2e tests and the correctness run.

Deterministic text, so that two runs (bidirectional off, then on) send the same first turns,
and each later turn builds its messages from the answers so far, as an agent would.
"""

from __future__ import annotations

from collections.abc import Callable

from tests.e2e.chat import Answer

Message = dict[str, str]
# One turn: the messages to send, given the answers of the turns before it.
TurnScript = Callable[[list[Answer]], list[Message]]

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
# The system prompt edited at its third word: only the chat template's head is still in common.
SYSTEM_EDITED = {"role": "system", "content": "You are a careful coding agent. " + text(1, 700)}


def user(i: int, n: int = 120) -> Message:
    return {"role": "user", "content": f"Step {i}: " + text(i + 10, n)}


def asst(a: Answer) -> Message:
    return {"role": "assistant", "content": a.text}


def edited(step: int, spelled: str) -> list[TurnScript]:
    """Turn 1, then turn 2 with turn 1's user message edited (its step number spelled out)."""
    return [
        lambda a: [SYSTEM, user(step)],
        lambda a: [
            SYSTEM,
            {"role": "user", "content": user(step)["content"].replace(f"Step {step}", f"Step {spelled}")},
            user(step + 1),
        ],
    ]


def long_conversation(k: int) -> list[TurnScript]:
    """Three growing turns to about 4k tokens, for TTFT."""
    return [
        lambda a: [SYSTEM, user(100 + k, 400)],
        lambda a: [SYSTEM, user(100 + k, 400), asst(a[0]), user(200 + k, 400)],
        lambda a: [SYSTEM, user(100 + k, 400), asst(a[0]), user(200 + k, 400), asst(a[1]), user(300 + k, 400)],
    ]


# Each scenario has its own steps: a prompt repeated verbatim in another conversation would be
# a full local prefix hit on decode, which in vLLM 0.32 (CPU) stalls until prefill's 30 s
# block lease expires (seen here before the fixes in docs/engine-notes.md) and would only slow the test.
SCENARIOS: dict[str, list[TurnScript]] = {
    # The agent loop: the whole history plus a tool result and a new step each turn.
    "grow": [
        lambda a: [SYSTEM, user(1)],
        lambda a: [SYSTEM, user(1), asst(a[0]), user(2, 300)],
        lambda a: [SYSTEM, user(1), asst(a[0]), user(2, 300), asst(a[1]), user(3, 300)],
    ],
    # An earlier user message edited: only the system prompt is still decode's.
    "edited": edited(11, "eleven"),
    # The first message edited (a word near its start), the rest of the history as it was:
    # everything decode holds after the edit is for other tokens, so prefill must read nothing.
    "edited_first": [
        lambda a: [SYSTEM, user(91)],
        lambda a: [SYSTEM_EDITED, user(91), asst(a[0]), user(92)],
    ],
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
LONG = {f"long{k}": long_conversation(k) for k in range(3)}
