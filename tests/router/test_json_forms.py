"""Every valid JSON form of an engine's answer reads the same as vLLM's compact one.

The same stream (and the same non-streamed answer) is spelled compactly and re-serialized:
spaces and tabs around `,` and `:`, keys in another order, keys spelled with \\u escapes,
numbers in other forms, `data:` without its space, CRLF or CR line ends. Each form must give
the same captured ids and kv, and the same content to the client (compared as parsed JSON:
a re-encoded line is compact again), wherever the socket splits the bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from pdx_router.entries import Captured
from pdx_router.filters import StreamFilter, filter_response
from pdx_router.ids import of_list

KV = {
    "do_remote_prefill": False,
    "do_remote_decode": True,
    "remote_block_ids": [[1, 2]],
    "remote_engine_id": "decode-0",
    "remote_num_tokens": 20,
    "remote_blocks_expiry_time": 1764582000.25,
}
ID_KEYS = ("token_ids", "prompt_token_ids")
INTERNALS = (*ID_KEYS, "kv_transfer_params")


def _chat_events() -> list[dict[str, Any]]:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1764582000, "model": "Qwen"}

    def choice(content: str, ids: list[int], finish: str | None = None) -> dict[str, Any]:
        return {"index": 0, "delta": {"content": content}, "logprobs": None, "finish_reason": finish, "token_ids": ids}

    first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    return [
        {**base, "choices": [first], "prompt_token_ids": [5, 6, 7]},
        # the fields' names inside strings are content, never fields
        {**base, "choices": [choice('a "token_ids":[9] token_ids é', [11])]},
        {**base, "choices": [choice('b \\u0041 "kv_transfer_params": {}', [12])]},
        {**base, "choices": [choice("", [2], "stop")], "kv_transfer_params": KV},
    ]


def _completion_events() -> list[dict[str, Any]]:
    base = {"id": "cmpl-1", "object": "text_completion", "created": 1764582000, "model": "Qwen"}

    def choice(text: str, ids: list[int], **extra: Any) -> dict[str, Any]:
        return {"index": 0, "text": text, **extra, "logprobs": None, "finish_reason": None, "token_ids": ids}

    return [
        {**base, "choices": [choice("x ", [11], prompt_token_ids=[5, 6, 7])]},
        {**base, "choices": [choice("y ", [12])]},
        {**base, "choices": [choice("", [2])], "kv_transfer_params": KV},
    ]


# ---------------------------------------------------------------- JSON spellings


Num = Callable[[float, str | None], str]


def _num_plain(x: float, _key: str | None) -> str:
    return json.dumps(x)


def _num_other(x: float, key: str | None) -> str:
    """Token ids as `1.1e1`, floats with an exponent; other ints as they are (a different
    type for the kv's ints would be a different value)."""
    if key in ID_KEYS:
        return f"{float(x):.6e}"
    if isinstance(x, float):
        return f"{x:.12E}"
    return json.dumps(x)


def _key_plain(k: str) -> str:
    return json.dumps(k)


def _key_underscores_escaped(k: str) -> str:
    return '"' + k.replace("_", "\\u005f") + '"'


def _key_all_escaped(k: str) -> str:
    return '"' + "".join(f"\\u{ord(c):04X}" for c in k) + '"'


@dataclass(frozen=True)
class Form:
    name: str
    comma: str = ","
    colon: str = ":"
    reverse: bool = False
    key: Callable[[str], str] = _key_plain
    num: Num = _num_plain
    prefix: bytes = b"data: "
    eol: bytes = b"\n"

    def dump(self, obj: Any, key: str | None = None) -> str:
        if isinstance(obj, dict):
            keys = list(obj)[::-1] if self.reverse else list(obj)
            return "{" + self.comma.join(self.key(k) + self.colon + self.dump(obj[k], k) for k in keys) + "}"
        if isinstance(obj, list):
            return "[" + self.comma.join(self.dump(v, key) for v in obj) + "]"
        if isinstance(obj, (int, float)) and not isinstance(obj, bool):
            return self.num(obj, key)
        return json.dumps(obj)  # strings with ensure_ascii: é is \u00e9

    def event(self, obj: dict[str, Any]) -> bytes:
        return self.prefix + self.dump(obj).encode() + self.eol * 2

    def stream(self, events: list[dict[str, Any]]) -> bytes:
        return b"".join(self.event(e) for e in events) + self.prefix + b"[DONE]" + self.eol * 2


class _PyDefault(Form):
    def dump(self, obj: Any, key: str | None = None) -> str:
        return json.dumps(obj, separators=(", ", ": "))


COMPACT = Form("compact")
FORMS = [
    _PyDefault("json.dumps default separators"),
    Form("spaces on both sides", comma=" , ", colon=" : "),
    Form("tabs", comma=",\t", colon="\t:\t"),
    Form("keys in reverse order", reverse=True),
    Form("underscores of keys escaped", key=_key_underscores_escaped),
    Form("every key char escaped", key=_key_all_escaped),
    Form("numbers in other forms", num=_num_other),
    Form("data: without its space", prefix=b"data:"),
    Form("data: with a tab", prefix=b"data:\t"),
    Form("CRLF", eol=b"\r\n"),
    Form("CR", eol=b"\r"),
    Form(
        "all at once",
        comma=" ,\t",
        colon=" : ",
        reverse=True,
        key=_key_all_escaped,
        num=_num_other,
        prefix=b"data:",
        eol=b"\r\n",
    ),
]
FORM_IDS = [f.name for f in FORMS]
EVENTS = {"chat": _chat_events(), "completion": _completion_events()}


# ---------------------------------------------------------------- helpers


def _run(blocks: list[bytes], capture: bool = True, strip_ids: bool = True) -> tuple[bytes, StreamFilter]:
    f = StreamFilter(capture=capture, strip_ids=strip_ids)
    return b"".join(f.feed(b) for b in blocks) + f.flush(), f


def _client_view(out: bytes) -> list[Any]:
    """What an SSE client reads: each data line's JSON (CR, LF and CRLF all end a line)."""
    docs: list[Any] = []
    for ln in out.splitlines():
        if ln.startswith(b"data:"):
            value = ln[5:].removeprefix(b" ")
            docs.append("[DONE]" if value.strip() == b"[DONE]" else json.loads(value))
    return docs


def _leaked(docs: list[Any]) -> list[str]:
    found = []
    for d in docs:
        if isinstance(d, dict):
            for h in [d, *d.get("choices", [])]:
                found += [k for k in INTERNALS if k in h]
    return found


def _same_capture(a: Captured, b: Captured) -> None:
    a.prompt(None), b.prompt(None)  # decode's array as it came, or checked text: the same ids
    assert a == b
    assert a.output_ids is None or all(type(x) is int for x in a.output_ids)


# ---------------------------------------------------------------- streams


@pytest.mark.parametrize("kind", list(EVENTS))
def test_the_compact_stream_is_captured_and_stripped(kind: str) -> None:
    out, f = _run([COMPACT.stream(EVENTS[kind])])
    assert f.captured.prompt(None) == of_list([5, 6, 7]) and f.captured.output_ids == [11, 12, 2]
    assert f.captured.kv == KV and f.captured.choices == 1 and not f.broken
    docs = _client_view(out)
    assert _leaked(docs) == [] and docs[-1] == "[DONE]"
    if kind == "chat":  # content that merely spells a field is left as it is
        assert docs[1]["choices"][0]["delta"]["content"] == 'a "token_ids":[9] token_ids é'
        assert docs[2]["choices"][0]["delta"]["content"] == 'b \\u0041 "kv_transfer_params": {}'


@pytest.mark.parametrize("kind", list(EVENTS))
@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_every_json_form_captures_and_shows_the_same(form: Form, kind: str) -> None:
    ref_out, ref = _run([COMPACT.stream(EVENTS[kind])])
    out, f = _run([form.stream(EVENTS[kind])])
    _same_capture(f.captured, ref.captured)
    assert not f.broken
    assert _client_view(out) == _client_view(ref_out)


@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_every_json_form_keeps_the_ids_a_client_asked_for(form: Form) -> None:
    ref_out, ref = _run([COMPACT.stream(EVENTS["chat"])], strip_ids=False)
    out, f = _run([form.stream(EVENTS["chat"])], strip_ids=False)
    _same_capture(f.captured, ref.captured)
    docs = _client_view(out)
    assert docs == _client_view(ref_out)
    assert docs[0]["prompt_token_ids"] == [5, 6, 7] and docs[1]["choices"][0]["token_ids"] == [11]
    assert "kv_transfer_params" not in docs[-2]


@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_every_json_form_strips_without_capturing(form: Form) -> None:
    out, f = _run([form.stream(EVENTS["chat"])], capture=False)
    assert _leaked(_client_view(out)) == []
    assert f.captured.output_ids is None and f.captured.kv == KV


@pytest.mark.parametrize("form", [COMPACT, *FORMS], ids=["compact", *FORM_IDS])
def test_any_split_of_any_form_gives_the_same_bytes_and_capture(form: Form) -> None:
    stream = form.stream(EVENTS["chat"])
    whole, ref = _run([stream])
    for cut in range(1, len(stream)):
        out, f = _run([stream[:cut], stream[cut:]])
        assert out == whole, cut
        assert f.captured == ref.captured, cut


@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_a_stream_of_any_form_cut_inside_the_last_event_is_not_stored(form: Form) -> None:
    *head, last = EVENTS["chat"]
    last_bytes = form.event(last)
    for cut in (len(last_bytes) // 3, len(last_bytes) // 2, len(last_bytes) - len(form.eol) * 2 - 1):
        out, f = _run([b"".join(form.event(e) for e in head) + last_bytes[:cut]])
        assert f.captured.kv is None, cut
        complete = out[: max(out.rfind(b"\n"), out.rfind(b"\r")) + 1]
        assert _leaked(_client_view(complete)) == [], cut


def test_ids_the_router_cannot_read_make_the_turn_unstorable() -> None:
    events = _chat_events()
    events[2]["choices"][0]["token_ids"] = ["12"]
    out, f = _run([Form("spaced", comma=", ", colon=": ").stream(events)])
    assert f.broken and f.captured.kv is None
    assert _leaked(_client_view(out)) == []


def test_a_line_that_is_not_json_is_dropped_and_the_turn_not_stored() -> None:
    stream = COMPACT.stream(EVENTS["chat"])
    bad = b'data: {"choices": [{"token_ids": [1]\n\n'
    out, f = _run([bad + stream])
    assert f.broken and f.captured.kv is None
    assert out == b"\n" + _run([stream])[0]  # the line goes, the blank line after it stays


# ---------------------------------------------------------------- non-streamed answers


def _answer(kind: str) -> dict[str, Any]:
    usage = {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    if kind == "chat":
        message = {"role": "assistant", "content": 'a "token_ids":[9]', "tool_calls": []}
        choice = {"index": 0, "message": message, "finish_reason": "stop", "token_ids": [11, 12, 2]}
        return {"id": "c", "choices": [choice], "usage": usage, "prompt_token_ids": [5, 6, 7], "kv_transfer_params": KV}
    choice = {"index": 0, "text": "x", "prompt_token_ids": [5, 6, 7], "token_ids": [11, 12, 2], "finish_reason": "stop"}
    return {"id": "c", "choices": [choice], "usage": usage, "kv_transfer_params": KV}


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_every_json_form_of_an_answer_captures_and_shows_the_same(form: Form, kind: str) -> None:
    ref = orjson.loads(orjson.dumps(_answer(kind)))
    ref_cap = filter_response(ref, capture=True, strip_ids=True)
    assert ref_cap.prompt(None) == of_list([5, 6, 7]) and ref_cap.output_ids == [11, 12, 2] and ref_cap.kv == KV
    data = orjson.loads(form.dump(_answer(kind)).encode())
    cap = filter_response(data, capture=True, strip_ids=True)
    _same_capture(cap, ref_cap)
    assert data == ref and _leaked([data]) == []
