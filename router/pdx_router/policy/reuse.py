"""Whether a turn reads decode's KV instead of recomputing it, how many tokens, and what is
kept for the conversation's next turn.

Reuse is only correct up to the longest common token prefix of what decode holds and the new
prompt, so every decision here is made on token ids and never guesses one it cannot name.
Engines with the pdx plugin make that check themselves (`pdx_contract.kv_prefix`): then the
router keeps decode's parameters as they came and reads the outcome from prefill's answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson
from pydantic import ValidationError

from pdx_contract import kv_prefix

from .. import ids
from ..endpoints import Endpoint
from ..entries import Captured, Entry
from ..ids import IdText
from ..tokens import blocks_for, infer_block_size
from . import Outcome

# ---------------------------------------------------------------- is the entry live


def check_entry(entry: Entry | None, now: float, endpoints: Sequence[Endpoint], generation: str) -> Outcome | None:
    """Reasons not to even look at the prompt: None means the entry is worth a prefix check."""
    if entry is None:
        return Outcome.MISS
    if now >= entry.deadline or entry.generation != generation:
        return Outcome.EXPIRED
    holder = next((e for e in endpoints if e.role == "decode" and e.url == entry.decode_url), None)
    if holder is None or not holder.healthy:
        return Outcome.EXPIRED
    if not entry.kv.get("remote_block_ids") or entry.num_tokens <= 0:
        return Outcome.EXPIRED
    return None


# ---------------------------------------------------------------- how much


@dataclass(frozen=True)
class ReusePlan:
    outcome: Outcome
    tokens: int = 0
    kv: dict[str, Any] | None = None  # what to send prefill; None = FRESH_PREFILL_KV


def cut_block_ids(block_ids: Any, num_blocks: int) -> list[list[int]]:
    """Keep the first num_blocks of every KV cache group.

    Prefill's reader pairs the *tail* of the remote list with its newly allocated blocks,
    so the list must end at the last block covering the reused tokens.
    """
    return [list(group[:num_blocks]) for group in block_ids]


def plan_reuse(entry: Entry, prompt_ids: IdText, threshold: int) -> ReusePlan:
    """Decide how many of decode's tokens prefill may read for this prompt.

    The last prompt token is always left for prefill to compute (it needs logits).
    """
    # An entry holds exactly num_tokens ids (make_entry cuts them so).
    lcp, held_more, prompt_more = ids.compare(entry.token_ids, entry.num_tokens, prompt_ids)
    usable = lcp if prompt_more else lcp - 1
    if usable < max(threshold, 1):
        diverged = held_more and prompt_more
        return ReusePlan(Outcome.PREFIX_MISMATCH if diverged else Outcome.BELOW_THRESHOLD)
    # A deep copy (the entry must stay intact); kv is JSON from decode's answer, and a JSON
    # round trip copies it ~7x faster than copy.deepcopy, on the TTFT path.
    kv = orjson.loads(orjson.dumps(entry.kv))
    if usable < entry.num_tokens:
        block_size = entry.block_size or infer_block_size(
            entry.num_tokens, max((len(g) for g in kv["remote_block_ids"]), default=0)
        )
        groups = kv["remote_block_ids"]
        if block_size is None or len(groups) != 1:
            # Unknown block size, or a hybrid model whose groups are clipped differently:
            # cutting could point prefill at the wrong blocks, so do not reuse at all.
            return ReusePlan(Outcome.PREFIX_MISMATCH)
        kv["remote_block_ids"] = cut_block_ids(groups, blocks_for(usable, block_size))
        kv["remote_num_tokens"] = usable
    kv["do_remote_decode"] = True
    kv["do_remote_prefill"] = False
    return ReusePlan(Outcome.HIT, usable, kv)


# ---------------------------------------------------------------- the turn's plan


class IdsSource(StrEnum):
    """Where a reuse candidate's prompt ids came from (the promptIds counters' names)."""

    REQUEST = "request"  # a completions prompt given as ids: nothing to tokenize
    LOCAL = "local"  # the router's own tokenizer, once trusted
    ENGINE = "engine"  # prefill's /tokenize


@dataclass(frozen=True)
class PromptIds:
    """The new prompt's ids, or None when no source had them (then the prefix cannot be checked)."""

    ids: IdText | None
    source: IdsSource | None = None
    text: str | None = None  # the chat prompt as the router's tokenizer rendered it, if it did


@dataclass(frozen=True)
class TurnPlan:
    """What is decided for a turn before its first hop; attempts and the store read it."""

    outcome: Outcome
    reused_tokens: int = 0
    kv: dict[str, Any] | None = None  # what prefill reads of decode's blocks (HIT only)
    compared_ids: IdText | None = None  # the prompt ids the prefix check compared (HIT only)
    local_ids: bool = False  # ...and they came from the router's own tokenizer
    text: str | None = None  # the chat prompt as the router's tokenizer rendered it
    affinity: str | None = None  # the decode that held the conversation's entry
    checked_by_engines: bool = False  # prefill checks the prefix; reused_tokens is what decode holds, at most
    turn: bytes | None = None  # the history digest of the turn the entry holds (policy.local), if kept


NO_CONVERSATION = TurnPlan(Outcome.NONE)


def no_reuse(entry: Entry | None, outcome: Outcome) -> TurnPlan:
    """A turn whose entry was not worth a prefix check (check_entry's outcome)."""
    return TurnPlan(outcome, affinity=entry.decode_url if entry is not None else None)


def plan_checked_by_engines(entry: Entry) -> TurnPlan:
    """A live entry whose decode named what it holds: prefill checks the prompt against it, so
    the router sends decode's parameters as they came and learns the outcome from prefill."""
    # Only these two keys change, so a shallow copy keeps the entry intact.
    kv = {**entry.kv, "do_remote_decode": True, "do_remote_prefill": False}
    return TurnPlan(
        Outcome.HIT, entry.num_tokens, kv, affinity=entry.decode_url, checked_by_engines=True, turn=entry.turn
    )


def plan_turn(entry: Entry, prompt: PromptIds, threshold: int) -> TurnPlan:
    """The plan for a live entry: reuse as much as the prefix check allows, on these ids."""
    affinity = entry.decode_url
    if prompt.ids is None:
        return TurnPlan(Outcome.PREFIX_MISMATCH, text=prompt.text, affinity=affinity)
    r = plan_reuse(entry, prompt.ids, threshold)
    if r.outcome is not Outcome.HIT:
        return TurnPlan(r.outcome, text=prompt.text, affinity=affinity)
    return TurnPlan(
        Outcome.HIT,
        reused_tokens=r.tokens,
        kv=r.kv,
        compared_ids=prompt.ids,
        local_ids=prompt.source is IdsSource.LOCAL,
        text=prompt.text,
        affinity=affinity,
        turn=entry.turn,
    )


def prompt_ids_of_completion(body: dict[str, Any]) -> IdText | None:
    """A completions prompt given as token ids needs no tokenize call."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(type(x) is int for x in prompt):
        try:
            return ids.of_list(prompt)
        except ValueError:
            return None  # a negative id: no token, nothing to compare
    return None


# ---------------------------------------------------------------- after the turn


def prompt_ids_agree(compared: IdText | None, used: IdText | None) -> bool:
    """Did the engine run the prompt the prefix check was made on? Unknown counts as yes:
    there is nothing to hold against the turn (decode's ids were not asked for)."""
    return compared is None or used is None or compared == used


def make_held_entry(decode_kv: dict[str, Any], decode: Endpoint, now: float, ttl_seconds: float) -> Entry | None:
    """The entry of a turn whose decode named the tokens it holds: its parameters as they came
    (the engines check the next prompt against them), or None if they are not well formed.
    The digests are prefill's to read: one it cannot read means no reuse, never wrong KV."""
    try:
        held = kv_prefix.HeldPrefix.model_validate(decode_kv[kv_prefix.HELD])
    except ValidationError:
        return None
    if not decode_kv.get("remote_block_ids"):
        return None
    if decode_kv.get("remote_blocks_expiry_time") is None:
        return None  # bidirectional off on decode: it does not keep the blocks
    return Entry(
        kv=dict(decode_kv),
        token_ids=IdText(b""),
        decode_url=decode.url,
        generation=decode.generation,
        stored_at=now,
        deadline=now + ttl_seconds,
        block_size=held.block_size,
    )


def make_entry(
    decode_kv: dict[str, Any] | None,
    prompt_ids: IdText | None,
    output_ids: Sequence[int] | None,
    decode: Endpoint,
    now: float,
    ttl_seconds: float,
) -> Entry | None:
    """Build the entry to store after a turn, or None when there is nothing safe to keep."""
    if not decode_kv or prompt_ids is None or output_ids is None:
        return None
    n = decode_kv.get("remote_num_tokens")
    if not isinstance(n, int) or n <= 0 or not decode_kv.get("remote_block_ids"):
        return None
    if decode_kv.get("remote_blocks_expiry_time") is None:
        return None  # bidirectional off on decode: it does not keep the blocks
    try:
        output = ids.of_list(output_ids)
    except ValueError:
        return None  # an id no token has: decode's answer is not to be built on
    total = ids.count(prompt_ids) + len(output_ids)
    if total < n:
        return None  # we cannot name every token decode holds: never guess
    held = ids.head(ids.join(prompt_ids, output), n, total)
    return Entry(
        kv=dict(decode_kv),
        token_ids=held,
        decode_url=decode.url,
        generation=decode.generation,
        stored_at=now,
        deadline=now + ttl_seconds,
        block_size=decode.block_size,
    )


@dataclass(frozen=True)
class Kept:
    """What a finished turn leaves for the next one."""

    entry: Entry | None
    mismatch: bool = False  # decode ran other ids than the plan compared: nothing is kept


def checked_outcome(prefill_kv: dict[str, Any] | None) -> tuple[Outcome, int]:
    """What prefill's check found, from its answer. A prefill that reports nothing did not
    check, so it read nothing (decode hides its count from such a prefill)."""
    raw = prefill_kv.get(kv_prefix.VERDICT) if prefill_kv is not None else None
    try:
        found = kv_prefix.Verdict.model_validate(raw)
    except ValidationError:
        return Outcome.PREFIX_MISMATCH, 0
    return Outcome(found.outcome), found.tokens


def after_turn(
    captured: Captured, compared_ids: IdText | None, decode: Endpoint, now: float, ttl_seconds: float
) -> Kept:
    """The entry to keep, if any. A reuse decision made on ids the engine did not use
    (/tokenize missed a template argument, or the router's tokenizer rendered differently)
    keeps nothing, so the conversation's next turn cannot build on it."""
    if captured.choices > 1:
        return Kept(None)  # several answers: no single history to continue
    if captured.kv is not None and kv_prefix.HELD in captured.kv:
        return Kept(make_held_entry(captured.kv, decode, now, ttl_seconds))
    prompt = captured.prompt(compared_ids)
    if not prompt_ids_agree(compared_ids, prompt):
        return Kept(None, mismatch=True)
    return Kept(make_entry(captured.kv, prompt, captured.output_ids, decode, now, ttl_seconds))
