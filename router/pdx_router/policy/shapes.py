"""The request each hop gets: the client's as the router serves it, then prefill, decode and
/tokenize. The client decides what is generated; the router decides what each engine is told
about KV, and nothing a client sends can point an engine at someone else's blocks."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdx_contract.first_token import ARG as FIRST_TOKEN_ARG
from pdx_contract.holds import LOCAL_TURN_KV
from pdx_contract.router_config import ConversationFrom, TenancyConfig

from ..chat_tokens import renders_plainly
from ..ids import IdText, fragment
from . import FoundBy, first_token, history, prompt_history
from .history import History
from .prompt_history import Prompt

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
    headers: dict[str, str]  # what the engines get: the engines' key if set, else the client's
    key: str | None  # the conversation's store key (tenant, id, KV scope); None: plain P/D, nothing stored
    wants_ids: bool  # the client asked for token ids itself: they stay in its answer
    request_id: str = ""  # in the answer's X-Request-ID, error bodies and the router's log lines
    tenant: str | None = None  # the tenant's digest; None: no identity, nothing shared
    # No id (and history allowed): the messages' digests find the entry and name the next one.
    # With an id they only tell which messages are new (Front.keep_history).
    history: History | None = None
    scope: str | None = None  # the KV scope's digest (history keys are bound to it)
    found_by: FoundBy = FoundBy.NONE
    # A completions prompt without an id (and history allowed): its prefixes find the entry.
    prompt: Prompt | None = None
    # Prefill affinity: the key that picks this conversation's prefill (engines.choose_prefill);
    # None: the least loaded prefill.
    affinity: str | None = None

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def conversational(self) -> bool:
        """The turn reads and keeps an entry: an id, a history or a prompt, of a known tenant
        and scope."""
        return self.key is not None or self.history is not None or self.prompt is not None

    @property
    def reads_text(self) -> bool:
        """The completion's text names the turn kept (a text prompt without an id)."""
        return self.prompt is not None and not self.prompt.of_ids

    @property
    def needs_output_ids(self) -> bool:
        """The generated ids name the turn kept (a prompt of ids without an id): decode is
        asked for them even when it names the tokens it holds."""
        return self.capture and self.prompt is not None and self.prompt.of_ids

    @property
    def capture(self) -> bool:
        """Ask decode for token ids, to store the turn: one choice of a known conversation."""
        return self.conversational and self.body.get("n", 1) in (1, None)

    def lookup_keys(self) -> tuple[str, ...]:
        """The store keys that may hold this turn's entry, the best first."""
        if self.key is not None:
            return (self.key,)
        if self.history is None or self.tenant is None or self.scope is None:
            return ()
        return tuple(history.key(self.tenant, self.scope, d) for d in self.history.lookup)

    def prompt_heads(self) -> tuple[str, ...]:
        """The store keys of the indexes that list the turns this prompt may continue."""
        return self.prompt.head_keys() if self.prompt is not None else ()

    def prompt_keys(self, lengths: Iterable[int]) -> tuple[str, ...]:
        """The store keys of this prompt's prefixes of these lengths, the longest first."""
        return self.prompt.keys(lengths) if self.prompt is not None else ()

    def keep(self, answer: Mapping[str, Any] | None, output_ids: Sequence[int] | None) -> Keep | None:
        """Where the finished turn is kept: its id's key, else its whole history's (the
        messages, then `answer`, the assistant message decode gave), else its prompt's (the
        prompt, then the completion's text or generated ids); None if unknown."""
        if self.key is not None:
            turn = self.history.turn(answer) if self.history is not None and answer is not None else None
            return Keep(self.key, turn)
        if self.tenant is None or self.scope is None:
            return None
        if self.history is not None:
            if answer is None:
                return None
            digest = self.history.turn(answer)
            return Keep(history.key(self.tenant, self.scope, digest), digest)
        if self.prompt is None or (done := self.prompt.turn(answer, output_ids)) is None:
            return None
        return Keep(done.key, done.digest, done.head_key, done.length)


@dataclass(frozen=True)
class Keep:
    """Where a finished turn's entry goes."""

    key: str
    turn: bytes | None = None  # the digest of the turn decode holds (a chat's: policy.local reads it)
    head: str | None = None  # a prompt's: the index the store lists the entry in, with its length
    length: int = 0


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
    or not, how many choices, which conversation) is what the engines do: vLLM reads a string
    "false" as false where Python would read it as true. The engines judge the rest."""
    for name in ("stream", "return_token_ids"):
        flag = body.get(name)
        if flag is not None and type(flag) is not bool:
            return f"{name}: must be a boolean (true or false), not {_kind(flag)}"
    n = body.get("n")
    if n is not None and not (type(n) is int and n >= 1):
        return f"n: must be a positive integer or null, not {_kind(n)}"
    for name in ("max_tokens", "max_completion_tokens"):
        m = body.get(name)
        if m is not None and not (type(m) is int and m >= 0):
            return f"{name}: must be a non-negative integer or null, not {_kind(m)}"
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
    for name in ("conversation_id", "cache_salt"):
        value = body.get(name)
        if value is not None and type(value) is not str:
            return f"{name}: must be a string, not {_kind(value)}"
    return None


@dataclass(frozen=True)
class Front:
    """What the router's deployment decides about every client request."""

    tenancy: TenancyConfig = field(default_factory=TenancyConfig)
    served_model: str = "default"  # what a request without `model` runs (for the KV scope)
    engine_key: str | None = None  # the engines' API key; None: the client's is forwarded
    conversation_from: ConversationFrom = "both"  # an id, the history, or an id when sent
    # Decode-local is on: a chat turn found by its id keeps its history's digests too, to tell
    # which of its messages the decode holding the conversation has not seen (policy.local).
    keep_history: bool = False
    # Every turn of a conversation goes to one prefill (affinity_key), whose prefix cache may
    # hold its history; off: the least loaded prefill.
    prefill_affinity: bool = False


def client_request(
    body: dict[str, Any], headers: Mapping[str, str], path: str, is_chat: bool, front: Front, request_id: str = ""
) -> ClientRequest:
    """The conversation comes from `conversation_id`, else the X-Session-ID header (an empty
    one is none), else (unless ids alone are configured) from a chat's messages or a
    completion's prompt; with none of them, plain P/D. It is shared only within the client's
    tenant and KV scope. Raises BadRequest for a body of the wrong types or an ambiguous
    identity."""
    if (problem := request_problem(body, is_chat)) is not None:
        raise BadRequest(problem)
    conversation, by = found_by_id(body, headers, front.conversation_from)
    clean, wants_ids = clean_client_body(body)
    tenant = tenant_of(headers, front.tenancy)
    if tenant is not None and front.tenancy.cache_isolation == "tenant":
        clean = salted(clean, tenant)
    scope = kv_scope(clean, front.served_model)
    key, past, prompt = None, None, None
    if tenant is not None and scope is not None:
        if conversation:
            key = entry_key(tenant, conversation, scope)
            if is_chat and front.keep_history:
                past = history.of_messages(clean["messages"])
        elif front.conversation_from != "id":
            if is_chat:
                past = history.of_messages(clean["messages"])
            else:
                prompt = prompt_history.of_body(clean, tenant, scope)
            by = FoundBy.HISTORY
    headers_out = engine_headers(headers, front.engine_key)
    found = by if key is not None or past is not None or prompt is not None else FoundBy.NONE
    affinity = affinity_key(key, clean, is_chat, tenant, scope, past) if front.prefill_affinity else None
    return ClientRequest(
        path, is_chat, clean, headers_out, key, wants_ids, request_id, tenant, past, scope, found, prompt, affinity
    )


def affinity_key(
    key: str | None,
    body: Mapping[str, Any],
    is_chat: bool,
    tenant: str | None,
    scope: str | None,
    past: History | None = None,
) -> str | None:
    """What ties a turn to its conversation's prefill, the same every turn: the conversation's
    store key (an id), else a chat's head, its messages through the first user message (an
    agent's instructions and task, which later turns re-send unchanged), bound to tenant and
    scope; taken from `past`, the request's history digests, when it has them (no second
    pass). None (the least loaded prefill): no identity, a completion without an id, or a chat
    with no user message."""
    if key is not None:
        return key
    if not is_chat or tenant is None or scope is None:
        return None
    if past is not None:
        return history.key(tenant, scope, past.first_user) if past.first_user is not None else None
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    for i, m in enumerate(messages):
        if isinstance(m, Mapping) and m.get("role") == "user":
            return history.key(tenant, scope, history.of_messages(messages[: i + 1]).head)
    return None


def found_by_id(
    body: Mapping[str, Any], headers: Mapping[str, str], mode: ConversationFrom
) -> tuple[str | None, FoundBy]:
    """The client's conversation id and where it was (the body wins), unless only the history
    counts."""
    if mode == "history":
        return None, FoundBy.NONE
    if sent := body.get("conversation_id"):
        return str(sent), FoundBy.ID
    if sent := headers.get("X-Session-ID"):
        return str(sent), FoundBy.HEADER
    return None, FoundBy.NONE


_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def request_id(sent: str | None, fresh: str) -> str:
    """The client's X-Request-ID when it is a plain token (it goes into log lines and headers),
    else a fresh one."""
    return sent if sent is not None and _REQUEST_ID.fullmatch(sent) else fresh


# vllm_xargs keys only the router sets. vLLM merges vllm_xargs into the request's extra args,
# where its connector reads kv_transfer_params (the same field by another door) and decode's
# logits processor the first token it must produce.
_ROUTER_XARGS = ("kv_transfer_params", FIRST_TOKEN_ARG)


def clean_client_body(body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Drop what a client must never control (kv_transfer_params, conversation_id, the router's
    vllm_xargs) and remember whether the client itself asked for token ids."""
    out = dict(body)
    out.pop("kv_transfer_params", None)
    out.pop("conversation_id", None)
    xargs = out.get("vllm_xargs")
    if isinstance(xargs, dict) and any(k in xargs for k in _ROUTER_XARGS):
        out["vllm_xargs"] = {k: v for k, v in xargs.items() if k not in _ROUTER_XARGS}
    return out, bool(out.get("return_token_ids"))


def _one_header(headers: Mapping[str, str], name: str) -> str | None:
    """A header's single value; sent twice it is ambiguous (a gateway that appended instead of
    overwriting, or a client smuggling a second one), so the request is refused."""
    getall = getattr(headers, "getall", None)  # aiohttp's multidict keeps every copy
    values = list(getall(name, ())) if getall is not None else []
    if len(values) > 1:
        raise BadRequest(f"{name}: header sent {len(values)} times; send it once")
    value = values[0] if values else headers.get(name)
    return value.strip() if value is not None and value.strip() else None


def _digest(*parts: str) -> str:
    # surrogatepass: a header's bytes that are not UTF-8 reach here as lone surrogates.
    return hashlib.sha256("\x00".join(parts).encode(errors="surrogatepass")).hexdigest()[:32]


def tenant_of(headers: Mapping[str, str], tenancy: TenancyConfig) -> str | None:
    """The tenant an entry belongs to, as a digest; None: the client has no identity, so
    nothing of its conversations is stored or read (see TenancyConfig)."""
    if tenancy.identity == "single":
        return _digest("single")
    auth = _one_header(headers, "Authorization")
    if auth is not None and auth.partition(" ")[0].lower() == "bearer" and not auth.partition(" ")[2].strip():
        auth = None  # "Bearer" and nothing: no key
    if tenancy.identity == "apiKey":
        return _digest("key", auth) if auth is not None else None
    assert tenancy.header is not None  # TenancyConfig's check
    named = _one_header(headers, tenancy.header)
    return _digest("header", named, auth or "") if named is not None else None


def salted(body: dict[str, Any], tenant: str) -> dict[str, Any]:
    """The body with its tenant's `cache_salt`, the client's own folded in (never trusted alone:
    no client can choose another tenant's salt). vLLM mixes the salt into the first block's hash,
    so no block of any engine cache is shared across tenants: no tenant learns from TTFT what
    another recently sent."""
    out = dict(body)
    out["cache_salt"] = _digest("salt", tenant, str(body.get("cache_salt") or ""))
    return out


def kv_scope(body: dict[str, Any], served_model: str) -> str | None:
    """What, besides the token ids, vLLM folds into its KV cache keys, so that KV is reused
    only under the same: the LoRA adapter (chosen by `model`) and `cache_salt`. vLLM also folds
    in multimodal inputs and prompt embeddings (v1/core/kv_cache_utils.py,
    generate_block_hash_extra_keys), which the router's token-id check cannot see: such a turn
    has no scope, and is neither reused nor stored."""
    if "prompt_embeds" in body:
        return None
    messages = body.get("messages")
    if isinstance(messages, list) and _has_non_text(messages):
        return None
    return _digest("scope", str(body.get("model") or served_model), str(body.get("cache_salt") or ""))


def entry_key(tenant: str, conversation: str, scope: str) -> str:
    """Tenant- and scope-bound store key; hashed so ids of any length or charset are safe in Redis."""
    return hashlib.sha256(f"{tenant}\x00{scope}\x00{conversation}".encode(errors="surrogatepass")).hexdigest()


def engine_headers(client: Mapping[str, str], engine_key: str | None) -> dict[str, str]:
    """The engines get the router's own key when one is set, and then never the client's."""
    if engine_key is not None:
        return {"Authorization": f"Bearer {engine_key}"}
    auth = client.get("Authorization")
    return {"Authorization": auth} if auth else {}


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


def prefill_on_ids(body: dict[str, Any], ids: IdText, kv: dict[str, Any], first: bool = False) -> dict[str, Any]:
    """A reused chat turn's prefill as a completions request on the exact ids the prefix
    check compared: prefill neither renders nor tokenizes the prompt again, and the KV it
    reads is for exactly those ids. Its one token is thrown away, so sampling fields go,
    unless it is the client's first token (`first`, policy.first_token)."""
    keep = (*_PREFILL_KEEPS, *first_token.SAMPLING) if first else _PREFILL_KEEPS
    out = {k: body[k] for k in keep if k in body}
    out.update(prompt=fragment(ids), max_tokens=1, stream=False, n=1, kv_transfer_params=dict(kv))
    return out


def prefill_request(
    req: ClientRequest, kv: dict[str, Any] | None, ids: IdText | None, first: bool = False
) -> tuple[str, dict[str, Any]]:
    """The prefill hop as (path, body); kv None means no reuse this attempt. `first`: its token
    goes to the client (policy.first_token), so prefill samples as the client asked and names it.

    Only a plainly rendered chat prefills on ids: decode renders the chat itself, and its
    prompt must be the ids prefill computed (a chat with tools, say, could render differently
    under engine flags the router cannot see; that one prefills as chat)."""
    path, body = req.path, None
    if kv is not None and ids is not None:
        if not req.is_chat:
            body = pin_completion_prompt(prefill_body(req.body, False, kv), ids)
        elif renders_plainly(req.body):
            path, body = "/v1/completions", prefill_on_ids(req.body, ids, kv, first)
    if body is None:
        body = prefill_body(req.body, req.is_chat, kv)
    if first:
        body["return_token_ids"] = True
        if (least := first_token.prefill_min_tokens(req.body)) is not None:
            body["min_tokens"] = least
    return path, body


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
    req: ClientRequest,
    prefill_kv: dict[str, Any] | None,
    compared_ids: IdText | None,
    names_held: bool = False,
    first_token_id: int | None = None,
) -> dict[str, Any]:
    """The decode hop's body; a reused completions turn (compared_ids set) runs the exact ids
    its prefill computed. A chat is left for decode to render (see pin_completion_prompt).
    A decode that names the tokens it holds (`names_held`) is not asked for ids: the engines
    check the next prompt themselves (unless the generated ids name the turn kept).
    `first_token_id`: the token the client already has (policy.first_token): decode starts with it."""
    out = decode_body(req.body, prefill_kv, want_token_ids=req.capture and (not names_held or req.needs_output_ids))
    if compared_ids is not None and not req.is_chat:
        out = pin_completion_prompt(out, compared_ids)
    if first_token_id is not None:
        xargs = out.get("vllm_xargs")
        out["vllm_xargs"] = {**(xargs if isinstance(xargs, dict) else {}), FIRST_TOKEN_ARG: first_token_id}
    return out


def local_decode_request(req: ClientRequest, compared_ids: IdText | None, names_held: bool = False) -> dict[str, Any]:
    """The body of a turn prefilled on the decode that holds its conversation (policy.local)."""
    return decode_request(req, dict(LOCAL_TURN_KV), compared_ids, names_held)


def pin_completion_prompt(body: dict[str, Any], ids: IdText) -> dict[str, Any]:
    """A completions prompt becomes the exact id list the prefix check compared.

    Chat has no such pin in vLLM (it always renders the messages itself, and ignores unknown
    keys in kv_transfer_params), so chat reuse rests on /tokenize rendering like the chat
    request does; `reuse.after_turn` checks that after every reused turn.
    """
    return {**body, "prompt": fragment(ids)}  # the text as it is, inside the body's JSON


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
