"""The request each hop gets: the client's as the router serves it, then prefill, decode and
/tokenize. The client decides what is generated; the router decides what each engine is told
about KV, and nothing a client sends can point an engine at someone else's blocks."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..chat_tokens import renders_plainly

# What prefill gets when there is nothing to reuse (the reference protocol's first hop).
FRESH_PREFILL_KV: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


# ---------------------------------------------------------------- the client's request


@dataclass(frozen=True)
class ClientRequest:
    """A client's completion request as the router serves it, decided once on arrival."""

    path: str
    is_chat: bool
    body: dict[str, Any]  # without what a client must never control
    headers: dict[str, str]  # what the engines get of the client's headers: its API key
    key: str | None  # the conversation's store key, tenant-scoped; None: plain P/D, nothing stored
    wants_ids: bool  # the client asked for token ids itself: they stay in its answer
    tenant: str | None = None

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def capture(self) -> bool:
        """Ask decode for token ids, to store the turn: one choice of a known conversation."""
        return self.key is not None and self.body.get("n", 1) in (1, None)


class BadRequest(ValueError):
    """The client's body cannot be served as it is: the message names the field and the fix."""


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def request_problem(body: dict[str, Any], is_chat: bool) -> str | None:
    """What is wrong with the types of a client's body, as `field: what it must be`, or None.

    Only the fields the router itself reads are checked here, so that what it decides (stream
    or not, which conversation) is what the engines do; the engines judge the rest."""
    for name in ("stream", "return_token_ids"):  # a string "false" would read as true
        flag = body.get(name)
        if flag is not None and type(flag) is not bool:
            return f"{name}: must be a boolean (true or false), not {_kind(flag)}"
    for name in ("max_tokens", "max_completion_tokens"):
        n = body.get(name)
        if n is not None and not (type(n) is int and n >= 0):
            return f"{name}: must be a non-negative integer or null, not {_kind(n)}"
    if is_chat:
        messages = body.get("messages")
        if messages is None:
            return "messages: required, a list of message objects"
        if type(messages) is not list:
            return f"messages: must be a list of message objects, not {_kind(messages)}"
        for i, m in enumerate(messages):
            if type(m) is not dict:
                return f"messages[{i}]: must be an object with role and content, not {_kind(m)}"
    elif "prompt" in body and not isinstance(body["prompt"], (str, list)):
        return f"prompt: must be a string or a list, not {_kind(body['prompt'])}"
    conversation = body.get("conversation_id")
    if conversation is not None and type(conversation) is not str:
        return f"conversation_id: must be a string, not {_kind(conversation)}"
    return None


def client_request(
    body: dict[str, Any], headers: Mapping[str, str], path: str, is_chat: bool, tenant_header: str | None
) -> ClientRequest:
    """The conversation comes from `conversation_id`, else the X-Session-ID header (an empty
    one is none: plain P/D). Raises BadRequest for a body of the wrong types."""
    if (problem := request_problem(body, is_chat)) is not None:
        raise BadRequest(problem)
    conversation = body.get("conversation_id") or headers.get("X-Session-ID")
    clean, wants_ids = clean_client_body(body)
    tenant = tenant_of(headers, tenant_header)
    key = entry_key(tenant, str(conversation)) if conversation else None
    forwarded = {"Authorization": headers["Authorization"]} if "Authorization" in headers else {}
    return ClientRequest(path, is_chat, clean, forwarded, key, wants_ids, tenant=tenant)


def clean_client_body(body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Drop what a client must never control (kv_transfer_params, conversation_id) and
    remember whether the client itself asked for token ids."""
    out = dict(body)
    out.pop("kv_transfer_params", None)
    out.pop("conversation_id", None)
    xargs = out.get("vllm_xargs")
    if isinstance(xargs, dict) and "kv_transfer_params" in xargs:
        # vLLM merges vllm_xargs into the request's extra args, where its connector reads
        # kv_transfer_params: the same field by another door.
        out["vllm_xargs"] = {k: v for k, v in xargs.items() if k != "kv_transfer_params"}
    return out, bool(out.get("return_token_ids"))


def tenant_of(headers: Mapping[str, str], tenant_header: str | None) -> str:
    """The tenant an entry belongs to: a configured header, else a hash of the API key."""
    if tenant_header:
        return str(headers.get(tenant_header, ""))
    auth = headers.get("Authorization")
    return hashlib.sha256(auth.encode(errors="surrogatepass")).hexdigest()[:32] if auth else ""


def entry_key(tenant: str, conversation: str) -> str:
    """Tenant-scoped store key; hashed so ids of any length or charset are safe in Redis."""
    # surrogatepass: a header's bytes that are not UTF-8 reach here as lone surrogates.
    return hashlib.sha256(f"{tenant}\x00{conversation}".encode(errors="surrogatepass")).hexdigest()


# ---------------------------------------------------------------- prefill


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


def prefill_request(req: ClientRequest, kv: dict[str, Any] | None, ids: list[int] | None) -> tuple[str, dict[str, Any]]:
    """The prefill hop as (path, body); kv None means no reuse this attempt.

    Only a plainly rendered chat prefills on ids: decode renders the chat itself, and its
    prompt must be the ids prefill computed (a chat with tools, say, could render differently
    under engine flags the router cannot see; that one prefills as chat)."""
    if kv is not None and ids is not None:
        if not req.is_chat:
            return req.path, pin_completion_prompt(prefill_body(req.body, False, kv), ids)
        if renders_plainly(req.body):
            return "/v1/completions", prefill_on_ids(req.body, ids, kv)
    return req.path, prefill_body(req.body, req.is_chat, kv)


# ---------------------------------------------------------------- decode


def decode_body(body: dict[str, Any], prefill_kv: dict[str, Any] | None, want_token_ids: bool) -> dict[str, Any]:
    """The decode hop: the client's request with prefill's kv_transfer_params, unchanged."""
    out = dict(body)
    if prefill_kv is not None:
        out["kv_transfer_params"] = prefill_kv
    if want_token_ids:
        out["return_token_ids"] = True
    return out


def decode_request(
    req: ClientRequest, prefill_kv: dict[str, Any] | None, compared_ids: list[int] | None
) -> dict[str, Any]:
    """The decode hop's body; a reused completions turn (compared_ids set) runs the exact ids
    its prefill computed. A chat is left for decode to render (see pin_completion_prompt)."""
    out = decode_body(req.body, prefill_kv, want_token_ids=req.capture)
    if compared_ids is not None and not req.is_chat:
        out = pin_completion_prompt(out, compared_ids)
    return out


def pin_completion_prompt(body: dict[str, Any], ids: list[int]) -> dict[str, Any]:
    """A completions prompt becomes the exact id list the prefix check compared.

    Chat has no such pin in vLLM (it always renders the messages itself, and ignores unknown
    keys in kv_transfer_params), so chat reuse rests on /tokenize rendering like the chat
    request does; `reuse.after_turn` checks that after every reused turn.
    """
    return {**body, "prompt": list(ids)}


# ---------------------------------------------------------------- /tokenize


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
