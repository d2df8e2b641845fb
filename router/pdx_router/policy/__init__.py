"""Every routing decision, as pure functions of their inputs.

Nothing in this package does I/O or reads the clock (callers pass `now`), so each decision is
unit-testable on its own and app.py only moves bytes, measures and records:

- `engines`: which generation, which prefill, which decode;
- `reuse`: whether a turn reads decode's KV, how many tokens, and what is kept for the next;
- `shapes`: the request each hop gets (client, prefill, decode, /tokenize);
- `history`, `prompt_history`: how a turn without a conversation id finds its entry (a chat
  by its messages, a completion by its prompt's prefix);
- `local`: whether a short follow-up turn is prefilled on the decode that holds it;
- `holds`: what a turn claims of decode's held KV, and what decode's answer means;
- `first_token`: whether a streamed turn's first token is prefill's, and what decode must not send again;
- `retry`: whether a failed hop is retried, and with what outcome;
- `trust`: whether the router's own tokenizer's ids may replace the engine's.

The outcome vocabulary they share lives here.
"""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    """What happened to reuse on one turn (the X-PDX-Reuse header and the counters)."""

    NONE = "none"  # no conversation (no id; no history, or ids only): plain P/D
    HIT = "hit"
    MISS = "miss"  # conversation known to nobody: first turn, or entry evicted
    EXPIRED = "expired"  # past the router's deadline, decode gone, or other generation
    DECLINED = "declined"  # prefill refused the read (HTTP 5xx); turn retried without reuse
    PREFIX_MISMATCH = "prefix_mismatch"  # history edited: common prefix below threshold
    BELOW_THRESHOLD = "below_threshold"  # too few tokens to be worth a remote read
    LOCAL = "local"  # prefilled on the decode that held the conversation (policy.local)
    RELEASED = "released"  # decode released the held KV under memory pressure (policy.holds)


class FoundBy(StrEnum):
    """How a turn named its conversation (the X-PDX-Found-By header and the counters)."""

    NONE = "none"  # no conversation: plain P/D
    ID = "id"  # the body's conversation_id
    HEADER = "header"  # X-Session-ID
    HISTORY = "history"  # the messages up to an assistant turn, or a completions prompt's prefix
