"""What a client makes of the router's event stream, and what of the router's own it finds."""

from __future__ import annotations

import json
import re
from typing import Any

from pdx_contract import kv_prefix

_EOL = re.compile(rb"\r\n|\r|\n")
KV = "kv_transfer_params"
IDS = ("token_ids", "prompt_token_ids")
PDX = (kv_prefix.HELD, kv_prefix.VERDICT, kv_prefix.CHECKED)  # the router's own, inside kv_transfer_params


def events(stream: bytes) -> list[bytes]:
    """Each event's data as an EventSource reads it (WHATWG HTML, "Interpreting an event
    stream"): data lines joined by LF, other fields and comments ignored. The last event
    counts even without its empty line (a browser drops it; other clients may not)."""
    out: list[bytes] = []
    data: list[bytes] = []
    for line in _EOL.split(stream):
        if not line:
            if data:
                out.append(b"\n".join(data))
                data = []
            continue
        field, colon, value = line.partition(b":")
        if field == b"data":
            data.append(value[1:] if colon and value[:1] == b" " else value)
    if data:
        out.append(b"\n".join(data))
    return out


def parsed(data: bytes) -> Any:
    """An event's data as a JSON client reads it; the bytes when it is not JSON."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return data


def router_fields(value: Any, strip_ids: bool) -> list[str]:
    """The router's fields where vLLM puts them (kv_transfer_params, and the pdx_ fields it
    carries, on the event; ids on it and its choices) in one event's data; in data that is not
    JSON, their names. (filters.py cuts exactly these; an engine's other fields pass.)"""
    if isinstance(value, bytes):
        names = [KV, *(("token_ids",) if strip_ids else ())]
        return [n for n in names if n.encode() in value]
    found: list[str] = []
    for event in value if isinstance(value, list) else [value]:
        if not isinstance(event, dict):
            continue
        found += [k for k in event if k == KV or k in PDX]
        choices = event.get("choices")
        holders = [event, *(c for c in choices if isinstance(c, dict))] if isinstance(choices, list) else [event]
        if strip_ids:
            found += [k for h in holders for k in IDS if k in h]
    return found


def without_router_fields(value: Any, strip_ids: bool) -> Any:
    """What the client must get of one engine event: the same, less the router's fields."""
    if not isinstance(value, dict):
        return value
    out = {k: v for k, v in value.items() if k != KV}
    if strip_ids:
        for k in IDS:
            out.pop(k, None)
        if isinstance(out.get("choices"), list):
            out["choices"] = [
                {k: v for k, v in c.items() if k not in IDS} if isinstance(c, dict) else c for c in out["choices"]
            ]
    return out
