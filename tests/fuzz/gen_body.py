"""Client request bodies: JSON values of any shape, the fields the router reads among them
(stream, n, messages, conversation_id, kv_transfer_params...) with values of every JSON type
and the strings a lax reader turns into something else ("false", "1")."""

from __future__ import annotations

from typing import Any

from .draw import Draw

FIELDS = (
    "model", "messages", "prompt", "stream", "return_token_ids", "n", "max_tokens", "max_completion_tokens",
    "conversation_id", "cache_salt", "kv_transfer_params", "vllm_xargs", "prompt_embeds", "stream_options",
    "tools", "temperature",
)  # fmt: skip
SCALARS: tuple[Any, ...] = (
    None, True, False, 0, 1, -1, 2, 1 << 62, -(1 << 63), 0.5, 1.0, float("1e300"), "", "false", "true", "1", "0",
    " ", "c1", "会话", "a\x00b", "null",
)  # fmt: skip


def value(d: Draw, depth: int = 0) -> Any:
    """Any JSON value, nested at most three deep."""
    kind = d.choice(("scalar", "scalar", "scalar", "list", "dict")) if depth < 3 else "scalar"
    if kind == "list":
        return [value(d, depth + 1) for _ in range(d.integer(0, 3))]
    if kind == "dict":
        return {d.choice((*FIELDS, "role", "content", "x")): value(d, depth + 1) for _ in range(d.integer(0, 3))}
    return d.choice(SCALARS)


def message(d: Draw) -> Any:
    if d.chance(0.8):
        content = d.choice(("hi", "", None, [{"type": "text", "text": "hi"}], [{"type": "image_url"}], 5))
        return {"role": d.choice(("user", "assistant", "system", 1)), "content": content}
    return value(d, 2)


def body(d: Draw) -> dict[str, Any]:
    """A client's body: mostly well formed, each field now and then of another type."""
    out: dict[str, Any] = {"model": "m"}
    if d.chance(0.9):
        out["messages"] = [message(d) for _ in range(d.integer(0, 3))] if d.chance(0.9) else value(d)
    if d.chance(0.3):
        out["prompt"] = d.choice(("hi", ["a", "b"], [1, 2], 5, None))
    for name in FIELDS[3:]:
        if d.chance(0.12):
            out[name] = value(d)
    if d.chance(0.2):
        out["vllm_xargs"] = {"kv_transfer_params": value(d), "pdx_first_token": value(d), "x": 1}
    return out
