"""decode's event streams as vLLM shapes them (a first event with the prompt's ids, a token
per event with its id, kv_transfer_params on the last), written in any valid JSON form: key
order, spaces and newlines (a JSON text over several data lines), escaped keys, integral
ids as floats, tricky contents; in SSE with any line end, comments and other fields."""

from __future__ import annotations

import random
from typing import Any

from .draw import Draw, RandomDraw

CONTENTS = (
    "", "hi", " the", 'a "token_ids":[9]', "kv_transfer_params", '"kv_transfer_params": {"x": 1}', "\\u",
    "data: {", "\n\n", "\r", "é会🙂", '"}', ",\"token_ids\":[1]", "prompt_token_ids", "\x00", "[DONE]",
)  # fmt: skip
GOOD_KV: dict[str, Any] = {
    "remote_block_ids": [[1, 2, 3]], "remote_num_tokens": 40, "remote_engine_id": "e1", "remote_host": "10.0.0.5",
    "remote_port": 5600, "remote_request_id": "r", "pdx_held_prefix": {"tokens": 40, "digest": "ab"},
}  # fmt: skip
BAD_KV: tuple[Any, ...] = (
    [1, 2, 3], "remote_block_ids=1", {"remote_block_ids": "1,2"}, {"remote_block_ids": [[-1]]},
    {"remote_block_ids": [[1]], "remote_num_tokens": 1.5}, {"remote_port": "80"}, None,
)  # fmt: skip
ROUTER_FIELDS = ("kv_transfer_params", "token_ids", "prompt_token_ids")


def _ids(d: Draw, n: int) -> list[int]:
    return [d.integer(0, 151_000) for _ in range(n)]


def events(d: Draw) -> list[dict[str, Any]]:
    """One answer's events, as JSON values."""
    chat = d.chance(0.6)
    prompt = _ids(d, d.integer(0, 12))
    out: list[dict[str, Any]] = []
    for i in range(d.integer(1, 6)):
        choice: dict[str, Any] = {"index": 0, "finish_reason": None}
        text = d.choice(CONTENTS)
        if chat:
            choice["delta"] = {"content": text} if i else {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        if d.chance(0.8):
            choice["token_ids"] = _ids(d, d.choice((1, 1, 1, 0, 3)))
        event: dict[str, Any] = {"id": "cmpl-1", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}
        if i == 0 and d.chance(0.8):
            if chat:
                event["prompt_token_ids"] = prompt
            else:
                choice["prompt_token_ids"] = prompt
        if d.chance(0.05):
            event["choices"].append({**choice, "index": 1})
        out.append(event)
    last = out[-1]
    if d.chance(0.8):
        last["kv_transfer_params"] = dict(GOOD_KV) if d.chance(0.8) else d.choice(BAD_KV)
        last["choices"][0]["finish_reason"] = "stop"
    if d.chance(0.1):  # kv on an event of its own, or twice
        out.append({"id": "cmpl-1", "choices": [], "kv_transfer_params": dict(GOOD_KV)})
    if d.chance(0.1):
        out.append({"id": "cmpl-1", "choices": [], "usage": {"prompt_tokens": len(prompt), "completion_tokens": 3}})
    return out


def _space(d: Draw) -> str:
    return d.choice(("", "", "", "", " ", "  ", "\n", "\t", " \n "))


def _string(d: Draw, text: str, key: bool) -> str:
    """A JSON string, some characters escaped (\\uXXXX, or the short escapes)."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif code < 0x20 or (d.chance(0.15 if key else 0.03) and code < 0x10000):
            out.append(f"\\u{code:04x}" if d.chance(0.5) else f"\\u{code:04X}")
        elif ch == "/" and d.chance(0.5):
            out.append("\\/")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _number(d: Draw, n: int | float, integral_forms: bool) -> str:
    if isinstance(n, float) or not integral_forms or not d.chance(0.1):
        return repr(n) if isinstance(n, float) else str(n)
    return d.choice((f"{n}.0", f"{n}e0", f"{n}E+0", f"{n * 10}e-1", f"{n}.000"))


def dump(d: Draw, value: Any, in_ids: bool = False) -> str:
    """value as JSON text, in a form drawn from those the grammar allows."""
    if isinstance(value, dict):
        items = list(value.items())
        if d.chance(0.3):
            at = d.integer(0, len(items))
            items = items[at:] + items[:at]
        parts = [
            _space(d) + _string(d, k, key=True) + _space(d) + ":" + _space(d) + dump(d, v, k in ROUTER_FIELDS[1:])
            for k, v in items
        ]
        return "{" + ",".join(parts) + _space(d) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_space(d) + dump(d, v, in_ids) + _space(d) for v in value) + "]"
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, (int, float)):
        return _number(d, value, in_ids)
    return _string(d, str(value), key=False)


def compact(value: Any) -> str:
    """vLLM's own form: no spaces (what the filter's byte surgery reads)."""
    import json

    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def sse(d: Draw, values: list[dict[str, Any]]) -> bytes:
    """The events as an SSE stream: a JSON text over as many data lines as it has lines."""
    eol = d.choice(("\n",) * 6 + ("\r\n", "\r"))
    vllm = d.chance(0.4)  # exactly as vLLM writes them, else any form
    out = []
    for value in values:
        if d.chance(0.05):
            out.append(d.choice((": keep-alive", "event: message", "id: 7", "retry: 100")) + eol)
        # The form's hundreds of small choices come from one drawn seed (a draw each would
        # make hypothesis's own bookkeeping most of the test's time).
        text = compact(value) if vllm else dump(RandomDraw(random.Random(d.integer(0, 1 << 32))), value)
        space = " " if vllm else d.choice((" ", " ", ""))
        out.extend("data:" + space + line + eol for line in text.split("\n"))
        out.append(eol)
    out.append("data: [DONE]" + eol + eol)
    return "".join(out).encode()
