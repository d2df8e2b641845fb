"""Find a conversation from its history, for clients that send no conversation id.

A stored turn is the messages the router was sent plus the assistant message it answered;
its key is the digest of that whole history. A later request that continues it holds the
same messages, so the digest of its messages up to one of its assistant messages names the
stored turn. Only prefixes ending at an assistant message can name one, so a lookup costs
one key per assistant turn (the last `MAX_KEYS`, longest first), never a scan.

The digests chain: each prefix's digest is the hash of the previous one and the message's
own digest, so all of a request's are computed in one pass, linear in its bytes, whatever
its length. Messages are compared in a canonical form (role, content text, tool calls, a
tool result's call id): what a client re-sends of an answer after a JSON round trip (a
string or text parts, absent or null content) reads the same; an edited answer does not.
Reasoning fields are left out, since chat templates drop them from past turns and clients
strip them, and so is the whitespace around a message's text. A near match is harmless
anyway: prefill checks the prompt's blocks against what decode holds and reads only those
that match.

Keys are bound to the tenant and KV scope, like conversation ids (`shapes.entry_key`), and
cannot collide with an id's key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

MAX_KEYS: Final = 8  # assistant turns tried per request, the longest first
DIGEST_BYTES: Final = 16


def _digest(data: bytes) -> bytes:
    """SHA-256, cut to 16 bytes: with the CPU's SHA instructions it hashed a 42 kB history
    in half BLAKE2b's time here."""
    return hashlib.sha256(data).digest()[:DIGEST_BYTES]


_START: Final = _digest(b"pdx-history-v1")
_sha256: Final = hashlib.sha256


def _text(content: Any) -> str:
    """A message's content as text, without the whitespace around it (clients often strip an
    answer before sending it back): a string, text parts joined by a line feed as vLLM joins
    them, absent or null as empty; other parts by their sorted JSON."""
    return _joined(content).strip()


def _joined(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                texts.append(orjson.dumps(part, option=orjson.OPT_SORT_KEYS).decode())
        return "\n".join(texts)
    return orjson.dumps(content, option=orjson.OPT_SORT_KEYS).decode()


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _tool_calls(calls: Any) -> list[list[str]]:
    """Each call as [id, function name, arguments text]."""
    if not isinstance(calls, list):
        return []
    out: list[list[str]] = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        fn = fn if isinstance(fn, dict) else {}
        cid = call.get("id") if isinstance(call, dict) else None
        out.append([str(cid or ""), str(fn.get("name") or ""), _arguments(fn.get("arguments") or "")])
    return out


def canonical(message: Any) -> bytes:
    """The form two messages are compared in: role, content text, tool calls, call id.

    Every turn of a conversation without an id hashes all its messages, so the common case
    (a dict, a string role and content, no tool calls) takes the shortest way to the same bytes."""
    if type(message) is not dict and not isinstance(message, Mapping):
        return orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
    get = message.get
    role, content, calls = get("role"), get("content"), get("tool_calls")
    form = [
        role if type(role) is str else str(role or ""),
        content.strip() if type(content) is str else _text(content),
        _tool_calls(calls) if calls else [],
        str(get("tool_call_id") or ""),
    ]
    return orjson.dumps(form)


def _step(chain: bytes, message: Any) -> bytes:
    return _sha256(chain + _sha256(canonical(message)).digest()[:DIGEST_BYTES]).digest()[:DIGEST_BYTES]


@dataclass(frozen=True)
class History:
    """A chat request's history digests: the lookup's, and where the stored turn's starts."""

    lookup: tuple[bytes, ...]  # one per assistant message, the longest prefix first, at most MAX_KEYS
    head: bytes  # the digest of all the request's messages
    at: tuple[int, ...] = ()  # the index of each lookup digest's assistant message
    # The digest of the messages through the first user message (prefill affinity's key, from
    # the same pass: the first user message is often most of a request's bytes); None: none.
    first_user: bytes | None = None

    def held_through(self, turn: bytes | None) -> int | None:
        """The index of the assistant message that ends the stored turn `turn` (so the
        messages after it are what its decode has not seen); None if no prefix is that turn."""
        if turn is None:
            return None
        for digest, index in zip(self.lookup, self.at, strict=False):
            if digest == turn:
                return index
        return None

    def turn(self, answer: Mapping[str, Any]) -> bytes:
        """The digest a stored turn is kept under: the request's messages, then its answer."""
        return _step(self.head, answer)


def of_messages(messages: Sequence[Any], max_keys: int = MAX_KEYS) -> History:
    """One pass over the messages; only the last `max_keys` assistant prefixes are kept."""
    chain = _START
    found: list[bytes] = []
    at: list[int] = []
    first_user: bytes | None = None
    for i, m in enumerate(messages):
        chain = _step(chain, m)
        if type(m) is not dict and not isinstance(m, Mapping):
            continue
        role = m.get("role")
        if role == "assistant":
            found.append(chain)
            at.append(i)
            if len(found) > max_keys:
                del found[0], at[0]
        elif role == "user" and first_user is None:
            first_user = chain
    return History(tuple(reversed(found)), chain, tuple(reversed(at)), first_user)


def key(tenant: str, scope: str, digest: bytes) -> str:
    """The store key of a history digest. An id's key is sha256(tenant NUL scope NUL id);
    this one has SOH where that has its second NUL (tenant and scope are fixed-length hex),
    so no id names it."""
    return hashlib.sha256(f"{tenant}\x00{scope}\x01".encode() + digest.hex().encode()).hexdigest()


def answer_message(content: str | None, tool_calls: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The assistant message as a client re-sends an answer (for `History.turn`)."""
    out: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        out["tool_calls"] = tool_calls
    return out
