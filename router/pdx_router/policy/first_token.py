"""Prefill's first token, streamed to the client at once (`router.firstTokenFromPrefill`).

Every P/D turn has prefill sample one token, which the reference protocol throws away: the
client's first token is decode's, after the second hop (decode's API, the P->D read, its first
step). With this on, a streamed turn's first chunk is prefill's token, written as soon as prefill
answers; decode is asked to start with that same token (`pdx_engine.first_token`, a logits
processor keyed by `pdx_contract.first_token.ARG` in `vllm_xargs`) and what it streams of it is
cut, so the client reads exactly what decode alone would have sent, one hop sooner.

Only where that holds: one choice, streamed, no log-probabilities or token ids asked for (the
opening carries neither), no `seed` (decode's generator would draw a different sequence), no
tools or structured output (their parsers see the first token in decode's pipeline differently),
and more than one token to generate. A `min_tokens` goes to prefill as 1 (`prefill_min_tokens`),
so that its token is not the end of text where decode's could not be. A first token that ends
the answer (a stop string, the end of text, an empty text) keeps the turn on the usual path:
decode produces the same ending itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson

# A request with any of these set keeps the usual path (see the module's docstring).
_KEEP_USUAL: Final = (
    "logprobs", "top_logprobs", "seed", "tools", "functions", "response_format", "structured_outputs",
    "guided_json", "guided_regex", "guided_choice", "guided_grammar", "echo", "prompt_logprobs",
    "best_of", "use_beam_search", "return_token_ids",
)  # fmt: skip
_NONE_ISH: Final[tuple[object, ...]] = (None, False, 0, "none", [], {})

# What prefill samples its first token with: the client's sampling fields (a reused chat turn
# prefills on ids as a completion, which otherwise keeps none of them).
SAMPLING: Final = (
    "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "logit_bias", "stop", "stop_token_ids", "ignore_eos", "bad_words", "allowed_token_ids", "skip_special_tokens",
    "spaces_between_special_tokens", "include_stop_str_in_output", "vllm_xargs",
)  # fmt: skip


def prefill_min_tokens(body: dict[str, Any]) -> int | None:
    """What prefill's one token honours of the client's `min_tokens`: 1 when any (decode may not
    end its answer at its first token either), else None."""
    wanted = body.get("min_tokens")
    return 1 if type(wanted) is int and wanted >= 1 else None


def eligible(body: dict[str, Any]) -> bool:
    """Can this request's first token be prefill's? (A streamed, single-choice turn with nothing
    that makes decode's first token depend on more than the token itself.)"""
    if body.get("stream") is not True or body.get("n", 1) not in (1, None):
        return False
    if any(body.get(name) not in _NONE_ISH for name in _KEEP_USUAL):
        return False
    if body.get("tool_choice") not in (None, "none"):
        return False
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    return limit is None or (type(limit) is int and limit > 1)


@dataclass(frozen=True)
class First:
    """Prefill's token as the client will see it."""

    token_id: int
    text: str


def of_answer(answer: dict[str, Any]) -> First | None:
    """Prefill's sampled token and its text from its (non-streamed) answer, or None when the
    turn must take the usual path: the token ended the answer, its text is empty (part of a
    character still to come), or the answer does not name exactly one token id."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    if choice.get("finish_reason") != "length":
        return None
    ids = choice.get("token_ids")
    if not isinstance(ids, list) or len(ids) != 1 or type(ids[0]) is not int:
        return None
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else choice.get("text")
    if not isinstance(text, str) or not text:
        return None
    return First(ids[0], text)


def opening(first: First, is_chat: bool, chunk_id: str, model: Any, created: int) -> bytes:
    """The events that carry prefill's token to the client, shaped as vLLM streams a first
    token: for a chat, the assistant's role chunk, then the token's text."""
    obj = "chat.completion.chunk" if is_chat else "text_completion"
    head = {"id": chunk_id, "object": obj, "created": created, "model": model}
    if is_chat:
        role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        text = {"index": 0, "delta": {"content": first.text}, "logprobs": None, "finish_reason": None}
        chunks = [{**head, "choices": [role]}, {**head, "choices": [text]}]
    else:
        chunks = [{**head, "choices": [{"index": 0, "text": first.text, "logprobs": None, "finish_reason": None}]}]
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)


class Cut:
    """Cuts from decode's stream what the opening already sent: the role, and the first token's
    text, per event, until both are gone; after that `done` and the stream passes untouched.
    Decode may send the token alone or folded with the next into one chunk (its API server
    merges outputs it has not yet sent), so text is cut by characters, not by chunk."""

    def __init__(self, first: First, is_chat: bool) -> None:
        self.text = first.text  # still to cut
        self.role = is_chat  # decode's role chunk still to cut
        self.is_chat = is_chat
        self.mismatch = False  # decode's text did not start with prefill's token: passed as it came

    @property
    def done(self) -> bool:
        return not self.text and not self.role

    def feed(self, block: bytes) -> bytes:
        """`block`: whole SSE events (what the relay's filter hands on)."""
        if self.done:
            return block
        out: list[bytes] = []
        for event in block.split(b"\n\n"):
            if not event:
                continue
            kept = event if self.done else self._event(event)
            if kept:
                out.append(kept + b"\n\n")
        return b"".join(out)

    def _event(self, event: bytes) -> bytes:
        if not event.startswith(b"data:") or event[5:].strip() == b"[DONE]":
            return event
        try:
            chunk = orjson.loads(event[5:])
        except orjson.JSONDecodeError:
            return event  # the relay's own checks deal with it
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            return event  # a usage chunk, or something this does not cut
        choice = choices[0]
        holder = choice.get("delta") if self.is_chat else choice
        if not isinstance(holder, dict):
            return event
        if self.role and "role" in holder:
            del holder["role"]
            self.role = False
        key = "content" if self.is_chat else "text"
        text = holder.get(key)
        if self.text and isinstance(text, str) and text:
            if text.startswith(self.text):
                holder[key], self.text = text[len(self.text) :], ""
            elif self.text.startswith(text):
                holder[key], self.text = "", self.text[len(text) :]
            else:
                self.mismatch, self.text, self.role = True, "", False
                return event
        if not holder.get(key) and choice.get("finish_reason") is None and _only_text(holder, key):
            return b""  # nothing left for the client in this event
        return b"data: " + orjson.dumps(chunk)


def _only_text(holder: dict[str, Any], key: str) -> bool:
    """Nothing in the delta (or completion choice) but its emptied text and vLLM's null fields."""
    ignored = {key, "index", "logprobs", "finish_reason", "stop_reason", "token_ids", "prompt_token_ids"}
    return all(k in ignored or v in (None, "", []) for k, v in holder.items())
