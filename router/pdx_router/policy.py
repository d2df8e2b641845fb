"""Pure routing decisions: which engines, whether to reuse decode's KV, and how much.

Nothing here does I/O or reads the clock; callers pass `now`. That keeps every decision
unit-testable and the HTTP plumbing in app.py free of policy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from .chat_tokens import renders_plainly
from .endpoints import Endpoint
from .entries import Entry
from .tokens import blocks_for, common_prefix_len, infer_block_size


class Outcome(StrEnum):
    """What happened to reuse on one turn (the X-PDX-Reuse header and the counters)."""

    NONE = "none"  # no conversation id: plain P/D
    HIT = "hit"
    MISS = "miss"  # conversation known to nobody: first turn, or entry evicted
    EXPIRED = "expired"  # past the router's deadline, decode gone, or other generation
    DECLINED = "declined"  # prefill refused the read (HTTP 5xx); turn retried without reuse
    PREFIX_MISMATCH = "prefix_mismatch"  # history edited: common prefix below threshold
    BELOW_THRESHOLD = "below_threshold"  # too few tokens to be worth a remote read


STATS_OUTCOMES = (
    Outcome.HIT,
    Outcome.MISS,
    Outcome.EXPIRED,
    Outcome.DECLINED,
    Outcome.PREFIX_MISMATCH,
    Outcome.BELOW_THRESHOLD,
)

# What prefill gets when there is nothing to reuse (the reference protocol's first hop).
FRESH_PREFILL_KV: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}

# Fields the router adds to learn token ids; removed from what the client receives.
INTERNAL_RESPONSE_FIELDS = ("prompt_token_ids", "token_ids")


# ---------------------------------------------------------------- engine choice


def _healthy(endpoints: Iterable[Endpoint], role: str, generation: str) -> list[Endpoint]:
    return [e for e in endpoints if e.role == role and e.healthy and e.generation == generation]


def choose_generation(endpoints: Sequence[Endpoint], preferred: str) -> str | None:
    """The generation to serve from: the configured one if it has a healthy pair, else the
    generation with the most healthy pairs (during a rollout), else None."""
    if _healthy(endpoints, "prefill", preferred) and _healthy(endpoints, "decode", preferred):
        return preferred
    prefill = Counter(e.generation for e in endpoints if e.role == "prefill" and e.healthy)
    decode = Counter(e.generation for e in endpoints if e.role == "decode" and e.healthy)
    pairs = {g: min(prefill[g], decode[g]) for g in prefill if decode[g] > 0}
    if not pairs:
        return None
    # Most pairs wins; ties broken by name so every replica picks the same one.
    return max(sorted(pairs), key=lambda g: pairs[g])


def least_loaded(candidates: Sequence[Endpoint]) -> Endpoint | None:
    """Least outstanding requests; first in list order on ties (stable, predictable)."""
    best: Endpoint | None = None
    for e in candidates:
        if best is None or e.outstanding < best.outstanding:
            best = e
    return best


def choose_prefill(endpoints: Sequence[Endpoint], generation: str) -> Endpoint | None:
    return least_loaded(_healthy(endpoints, "prefill", generation))


def choose_decode(endpoints: Sequence[Endpoint], generation: str, affinity_url: str | None) -> Endpoint | None:
    """The decode holding the conversation's KV if usable, else least outstanding."""
    candidates = _healthy(endpoints, "decode", generation)
    if affinity_url is not None:
        for e in candidates:
            if e.url == affinity_url:
                return e
    return least_loaded(candidates)


# ---------------------------------------------------------------- reuse


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


def plan_reuse(entry: Entry, prompt_ids: Sequence[int], threshold: int) -> ReusePlan:
    """Decide how many of decode's tokens prefill may read for this prompt.

    Reuse is only correct up to the longest common token prefix of what decode holds and the
    new prompt; the last prompt token is always left for prefill to compute (it needs logits).
    """
    held = entry.token_ids[: entry.num_tokens]
    lcp = common_prefix_len(held, prompt_ids)
    usable = min(lcp, len(prompt_ids) - 1)
    if usable < max(threshold, 1):
        diverged = lcp < len(held) and lcp < len(prompt_ids)
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


# ---------------------------------------------------------------- request bodies


def clean_client_body(body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Drop what a client must never control (kv_transfer_params, conversation_id) and
    remember whether the client itself asked for token ids."""
    out = dict(body)
    out.pop("kv_transfer_params", None)
    out.pop("conversation_id", None)
    return out, bool(out.get("return_token_ids"))


def prefill_body(body: dict[str, Any], is_chat: bool, kv: dict[str, Any] | None) -> dict[str, Any]:
    """The prefill hop: one token, not streamed, with do_remote_decode (+ decode's entry)."""
    out = dict(body)
    out["max_tokens"] = 1
    if is_chat:
        out["max_completion_tokens"] = 1
    else:
        out.pop("max_completion_tokens", None)
    out["stream"] = False
    out.pop("stream_options", None)
    out.pop("min_tokens", None)
    out.pop("return_token_ids", None)
    out["n"] = 1
    out["kv_transfer_params"] = dict(kv) if kv is not None else dict(FRESH_PREFILL_KV)
    return out


def decode_body(body: dict[str, Any], prefill_kv: dict[str, Any] | None, want_token_ids: bool) -> dict[str, Any]:
    """The decode hop: the client's request with prefill's kv_transfer_params, unchanged."""
    out = dict(body)
    if prefill_kv is not None:
        out["kv_transfer_params"] = prefill_kv
    if want_token_ids:
        out["return_token_ids"] = True
    return out


# Chat request fields that still matter to a prefill given token ids (LoRA via model,
# prefix-cache isolation, scheduling).
_PREFILL_KEEPS = ("model", "cache_salt", "priority")


def prefill_on_ids(body: dict[str, Any], ids: list[int], kv: dict[str, Any]) -> dict[str, Any]:
    """A reused chat turn's prefill as a completions request on the exact ids the prefix
    check compared: prefill neither renders nor tokenizes the prompt again, and the KV it
    reads is for exactly those ids. Its one token is thrown away, so sampling fields go."""
    out = {k: body[k] for k in _PREFILL_KEEPS if k in body}
    out.update(prompt=list(ids), max_tokens=1, stream=False, n=1, kv_transfer_params=dict(kv))
    return out


def prefill_request(
    body: dict[str, Any], is_chat: bool, path: str, kv: dict[str, Any] | None, ids: list[int] | None
) -> tuple[str, dict[str, Any]]:
    """The prefill hop as (path, body); kv None means no reuse this attempt.

    Only a plainly rendered chat prefills on ids: decode renders the chat itself, and its
    prompt must be the ids prefill computed (a chat with tools, say, could render differently
    under engine flags the router cannot see; that one prefills as chat)."""
    if kv is not None and ids is not None:
        if not is_chat:
            return path, pin_completion_prompt(prefill_body(body, False, kv), ids)
        if renders_plainly(body):
            return "/v1/completions", prefill_on_ids(body, ids, kv)
    return path, prefill_body(body, is_chat, kv)


def pin_completion_prompt(body: dict[str, Any], ids: list[int]) -> dict[str, Any]:
    """A completions prompt becomes the exact id list the prefix check compared.

    Chat has no such pin in vLLM (it always renders the messages itself, and ignores unknown
    keys in kv_transfer_params), so chat reuse rests on /tokenize rendering like the chat
    request does; `prompt_ids_agree` checks that after every reused turn.
    """
    return {**body, "prompt": list(ids)}


def prompt_ids_agree(compared: list[int] | None, used: list[int] | None) -> bool:
    """Did the engine run the prompt the prefix check was made on? Unknown counts as yes:
    there is nothing to hold against the turn (decode's ids were not asked for)."""
    return compared is None or used is None or compared == used


def make_entry(
    decode_kv: dict[str, Any] | None,
    prompt_ids: Sequence[int] | None,
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
    held = [*prompt_ids, *output_ids][:n]
    if len(held) < n:
        return None  # we cannot name every token decode holds: never guess
    return Entry(
        kv=dict(decode_kv),
        token_ids=held,
        decode_url=decode.url,
        generation=decode.generation,
        stored_at=now,
        deadline=now + ttl_seconds,
        block_size=decode.block_size,
    )


def tokenize_body(body: dict[str, Any], is_chat: bool, model: str | None) -> dict[str, Any] | None:
    """The /tokenize request that renders this prompt like the completion would, or None
    when it cannot be rendered that way (batch prompts, non-text content)."""
    if is_chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or _has_non_text(messages):
            return None
        out: dict[str, Any] = {"messages": messages}
        # vLLM renders tools even with tool_choice "none" unless the engine runs with
        # --exclude-tools-when-tool-choice-none; a difference shows in the parity check.
        for key in (
            "add_generation_prompt",
            "continue_final_message",
            "add_special_tokens",
            "chat_template",
            "chat_template_kwargs",
            "mm_processor_kwargs",
            "tools",
        ):
            if key in body:
                out[key] = body[key]
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return None
        out = {"prompt": prompt}
        if "add_special_tokens" in body:
            out["add_special_tokens"] = body["add_special_tokens"]
    if model is not None:
        out["model"] = model
    return out


def _has_non_text(messages: list[Any]) -> bool:
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list) and any(not (isinstance(p, dict) and p.get("type") == "text") for p in content):
            return True
    return False


def prompt_ids_of_completion(body: dict[str, Any]) -> list[int] | None:
    """A completions prompt given as token ids needs no tokenize call."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(type(x) is int for x in prompt):
        return list(prompt)
    return None
