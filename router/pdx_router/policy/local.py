"""Whether a follow-up turn is prefilled on the decode that holds its conversation.

That decode ended the last turn with its KV: held for prefill to read back, and in its own
prefix cache. For a short new suffix, computing it there costs less than the D->P path (a
prefill hop, a read of the whole history, then decode's read of prefill's blocks). But a
local prefill runs in decode's batch and delays the next token of every stream decode is
generating, which is what P/D exists to avoid: so only a short suffix goes local, and only
while that decode is not busy.

Decode's prefix cache is exact by block hash: a local turn never computes on wrong KV. A
wrong suffix estimate costs time (a longer local prefill), never correctness.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from .. import ids
from ..endpoints import Endpoint
from . import Outcome, holds
from .history import History, canonical
from .reuse import TurnPlan

# What a token of chat text takes, in bytes of its canonical form (role, text, tool calls as
# JSON): English prose runs ~4-6 under Qwen's and Llama's vocabularies, code and JSON ~3. The
# estimate is only used without the router's tokenizer (`router.tokenizer: router` counts).
BYTES_PER_TOKEN: Final = 4
# The chat template's markers around each message, and the generation prompt after them.
MESSAGE_TOKENS: Final = 8
# A decode's scraped load younger than this is trusted as it is (`worth_a_fresh_look`).
FRESH_S: Final = 0.5
FRESH_TIMEOUT_S: Final = 0.1  # what a fresh look may cost a turn: less than the D->P way's extra


class Why(StrEnum):
    """The decision on a turn that could read decode's KV (the skipped counter's label)."""

    LOCAL = "local"
    OFF = "off"  # decodeLocalMaxTokens is 0 (not counted)
    NOT_HELD = "not_held"  # no usable entry: the turn goes through prefill anyway (not counted)
    UNKNOWN = "unknown"  # what the decode lacks cannot be told: the history was edited, or not kept
    LONG = "long"  # more new tokens than decodeLocalMaxTokens (than decodeLocalIdleMaxTokens on an idle decode)
    BUSY = "busy"  # the decode has decodeLocalMaxBusy requests in flight, or more
    HOLDER = "holder"  # the decode that holds it serves no new turns (draining, unhealthy, other generation)
    RELEASED = "released"  # that decode said it released the hold's blocks: its cache may have given them away
    SHORTENED = "shortened"  # decode gave up the hold's tail: the new tokens are few, those plus the tail are not


SKIPPED: Final = (Why.UNKNOWN, Why.LONG, Why.BUSY, Why.HOLDER, Why.RELEASED, Why.SHORTENED)


@dataclass(frozen=True)
class Rule:
    """router.json's decodeLocalMaxTokens, decodeLocalMaxBusy and decodeLocalIdleMaxTokens."""

    max_tokens: int = 0
    max_busy: int = 4
    idle_max_tokens: int = 0

    @property
    def cap(self) -> int:
        """The most new tokens any turn may have to go local (on an idle decode)."""
        return max(self.max_tokens, self.idle_max_tokens) if self.max_tokens > 0 else 0


def suffix_messages(messages: Sequence[Any], history: History | None, turn: bytes | None) -> Sequence[Any] | None:
    """The messages after the stored turn's answer: what its decode has not seen. None when the
    request does not continue that turn word for word (an edit, a stored turn of unknown history)."""
    if history is None:
        return None
    end = history.held_through(turn)
    return None if end is None else messages[end + 1 :]


def estimate_tokens(messages: Sequence[Any]) -> int:
    """The tokens the messages render to, from their bytes (see BYTES_PER_TOKEN)."""
    return _Sized(messages).estimate


def upper_bound(messages: Sequence[Any]) -> int:
    """At least the tokens the messages count as (`count_tokens`): a byte-level BPE token holds
    at least one byte of its text, a SentencePiece one at least a character (plus the space it
    may put in front); hence the canonical form's bytes, one, and the template's markers. (A
    normalizer that expands text, NFKC's ligatures, could pass it: a longer local prefill,
    never wrong KV.)"""
    return _Sized(messages).bound


class _Sized:
    """The messages' canonical forms, taken once, and what their size says of their tokens."""

    def __init__(self, messages: Sequence[Any]) -> None:
        self.forms = [canonical(m) for m in messages]
        self.markers = MESSAGE_TOKENS * (len(messages) + 1)
        size = sum(len(f) for f in self.forms)
        self.estimate = -(-size // BYTES_PER_TOKEN) + self.markers
        self.bound = size + 1 + self.markers


def count_tokens(messages: Sequence[Any], count: Callable[[str], int] | None, cap: int, sure: int = 0) -> int:
    """The tokens of the new messages: by the router's tokenizer (`ChatTokenizer.count`) when it
    has one, else estimated. Messages whose estimate is twice `cap` or more are not tokenized: they are
    too long to go local whatever the count. Messages whose `upper_bound` is at most `sure`
    (`sure_local`) are not tokenized either: the bound decides as the count would. On the H200
    the count of a 2k-token tool output took 4-5 ms of the turn's 90-120, 26 ms at 8k."""
    sized = _Sized(messages)
    if sized.bound <= sure:
        return sized.bound
    if count is None or sized.estimate >= 2 * cap:
        return sized.estimate
    return count(b"".join(sized.forms).decode()) + sized.markers


def exact_suffix(plan: TurnPlan) -> int | None:
    """The new tokens when the router compared the prompt's ids itself: all of them but the
    ones prefill would have read."""
    if plan.compared_ids is None:
        return None
    return ids.count(plan.compared_ids) - plan.reused_tokens


def busy(decode: Endpoint) -> int:
    """Requests in flight on a decode: this router's own, now, and other router replicas' as
    last scraped."""
    return decode.outstanding + (decode.others_load or 0)


def others_load(engine_load: int | None, own: int) -> int | None:
    """The engine's running and waiting requests less this router's own in flight at the scrape
    (the larger of its counts before and after, so that our turn ending meanwhile is not taken for
    another replica's). Taken whole, a scrape that found our own turn decoding left the decode
    busy for the next health-check interval: on the H100 every 12k-token follow-up of one wave
    went the D->P way on an idle decode."""
    return None if engine_load is None else max(0, engine_load - own)


def worth_a_fresh_look(suffix_tokens: int | None, holder: Endpoint | None, rule: Rule, now: float) -> bool:
    """Whether only other requests a scrape saw on decode, not just now, keep a long suffix off
    that otherwise idle decode: then its load is scraped again before the turn goes the D->P way.
    A scrape lasts a health-check interval (5 s): one that caught a short request of someone
    else's (another replica's turn, a benchmark's bound sent straight to decode) sent each long
    suffix of the next seconds through prefill (on the H100, every 2k-token follow-up of the first
    conversation at 12k and 20k: 153-263 ms against 93-124 local). Bounded: at most one fresh
    look per decode every FRESH_S."""
    return (
        holder is not None
        and suffix_tokens is not None
        and rule.max_tokens < suffix_tokens <= rule.idle_max_tokens
        and holder.outstanding == 0
        and (holder.others_load or 0) > 0
        and now - holder.load_seen > FRESH_S
    )


def sure_local(plan: TurnPlan, holder: Endpoint | None, rule: Rule) -> int:
    """The most new tokens that go local on `holder` as it looks now, whatever their exact count
    below it: idle_max_tokens on a decode with nothing in flight, else max_tokens, less the tail
    a shortened hold lost (`decide`). 0 when no turn goes local by size alone."""
    if holder is None or rule.max_tokens <= 0:
        return 0
    limit = max(rule.max_tokens, rule.idle_max_tokens) if busy(holder) == 0 else rule.max_tokens
    return max(0, limit - _lost_tail(plan, holder))


def _lost_tail(plan: TurnPlan, holder: Endpoint) -> int:
    """Of what the plan reads of decode's hold, the tokens decode gave up by shortening it."""
    return holds.tokens_given_up(holder, holds.hold_id(plan.kv), plan.reused_tokens)


def decide(plan: TurnPlan, suffix_tokens: int | None, holder: Endpoint | None, rule: Rule) -> Why:
    """Local when decode-local is on, the turn's entry is usable, its decode serves and is not
    busy, and the new tokens are known and few: at most max_tokens, or at most idle_max_tokens
    while the decode has nothing in flight. `holder` is the decode `engines.choose_decode`
    picked for the turn (it must be the entry's)."""
    if rule.max_tokens <= 0:
        return Why.OFF
    if plan.outcome is not Outcome.HIT or plan.affinity is None:
        return Why.NOT_HELD
    if holder is None or holder.url != plan.affinity:
        return Why.HOLDER
    if holds.blocks_given_up(holder, holds.hold_id(plan.kv)):
        # Released under pressure: its blocks went back to the pool for the work that needed
        # them, so decode would compute the whole history again, in its batch; through prefill
        # the turn is `released` (prefill computes, decode reads), as it is after a claim. A
        # superseded hold (a younger one covers its blocks: a retried turn) still goes local.
        return Why.RELEASED
    if suffix_tokens is None:
        return Why.UNKNOWN
    # A hold decode shortened under pressure: its prefix cache lost the tail, which a local turn
    # would compute again in decode's batch; through prefill, the claim cuts the read to the kept
    # prefix and prefill computes the rest.
    lost = _lost_tail(plan, holder)
    why = _by_size(suffix_tokens + lost, holder, rule)
    if lost and why is not Why.LOCAL and _by_size(suffix_tokens, holder, rule) is Why.LOCAL:
        return Why.SHORTENED
    return why


def _by_size(new_tokens: int, holder: Endpoint, rule: Rule) -> Why:
    """Local for `new_tokens` to compute on `holder`: at most max_tokens on a decode that is not
    busy, or at most idle_max_tokens on an idle one."""
    if new_tokens > rule.max_tokens:
        return Why.LOCAL if new_tokens <= rule.idle_max_tokens and busy(holder) == 0 else Why.LONG
    if busy(holder) >= rule.max_busy:
        return Why.BUSY
    return Why.LOCAL
