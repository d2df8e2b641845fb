"""The fault suite, part two: engines that answer wrongly, and clients that send wrongly.

Each case injects one fault and checks what the client got (status, body, and nothing of the
router's internals: no kv_transfer_params, no token ids it did not ask for, no engine URL, no
traceback), what was stored (nothing for a failed turn, never a wrong-shaped kv), what the
metrics say, and that the router serves the next turn. The figures go to the suite's tally.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from pdx_router.entries import Entry
from pdx_router.filters import StreamFilter, well_formed_kv
from pdx_router.policy.shapes import request_problem
from pdx_router.store import MemoryStore
from tests.faults.tally import TALLY
from tests.router.conftest import Stack, StackFactory
from tests.router.helpers import EVIL, LONG, assistant, key_of, user

pytestmark = pytest.mark.faults

CHAT = "/v1/chat/completions"
BAD_KV: dict[str, Any] = {
    "list": [1, 2, 3],
    "string": "remote_block_ids=1,2",
    "blocks_string": {"remote_block_ids": "1,2,3", "remote_num_tokens": 20},
    "blocks_flat_strings": {"remote_block_ids": [["1", "2"]], "remote_num_tokens": 20},
    "blocks_negative": {"remote_block_ids": [[-1, 2]], "remote_num_tokens": 20},
    "tokens_negative": {"remote_block_ids": [[1, 2]], "remote_num_tokens": -5},
    "tokens_huge": {"remote_block_ids": [[1, 2]], "remote_num_tokens": 1 << 62},
    "tokens_float": {"remote_block_ids": [[1, 2]], "remote_num_tokens": 20.5},
    "tokens_bool": {"remote_block_ids": [[1, 2]], "remote_num_tokens": True},
    "port_string": {"remote_block_ids": [[1, 2]], "remote_num_tokens": 20, "remote_port": "80"},
}


# ---------------------------------------------------------------- helpers


def _record(name: str, survived: bool) -> None:
    TALLY.injected.append(name)
    if survived:
        TALLY.survived.append(name)


def _count_reads(s: Stack) -> None:
    TALLY.reads += len(s.cluster.reads)
    TALLY.wrong_kv += sum(not r.correct for r in s.cluster.reads)


async def _post(
    http: aiohttp.ClientSession, s: Stack, body: Any, headers: dict[str, str] | None = None, path: str = CHAT
) -> tuple[int, dict[str, str], bytes]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    TALLY.turns += 1
    async with http.post(s.url + path, data=data, headers={"Content-Type": "application/json", **(headers or {})}) as r:
        return r.status, dict(r.headers), await r.read()


def _clean(s: Stack, raw: bytes, ids_asked: bool = False) -> None:
    """Nothing of the router's own reaches the client."""
    assert b'kv_transfer_params"' not in raw and b'kv_transfer_params\\"' not in raw  # as a key
    if not ids_asked:
        assert b'token_ids"' not in raw
    for url in s.prefill_urls + s.decode_urls:
        assert url.encode() not in raw and url.rsplit(":", 1)[1].encode() + b"/" not in raw
    assert b"Traceback" not in raw and b"500 Internal Server Error" not in raw


def _entries(s: Stack) -> dict[str, Entry]:
    store = s.router.store
    assert isinstance(store, MemoryStore)
    return dict(store._items)


def _key(s: Stack, conversation: str, auth: str | None = None) -> str:
    return key_of(s.router, conversation, {"Authorization": auth} if auth else {})


def _metric(s: Stack, name: str, **labels: str) -> float:
    return s.router.metrics.registry.get_sample_value(name, labels) or 0.0


def _error_message(raw: bytes) -> str:
    msg = orjson.loads(raw)["error"]["message"]
    assert isinstance(msg, str)
    return msg


def _events(raw: bytes) -> list[Any]:
    out: list[Any] = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data: "):
            out.append("[DONE]" if line == b"data: [DONE]" else orjson.loads(line[6:]))
    return out


async def _next_turn_served(http: aiohttp.ClientSession, s: Stack, conversation: str, stream: bool) -> bool:
    """A healthy engine again, a new conversation: served, clean, and stored."""
    for eng in s.prefills + s.decodes:
        eng.opts.malform = None
    body = {"model": "Qwen", "messages": [user(LONG)], "stream": stream, "conversation_id": conversation}
    status, _, raw = await _post(http, s, body)
    ok = status == 200 and _key(s, conversation) in _entries(s)
    if ok:
        _clean(s, raw)
    else:
        TALLY.lost += 1
    return ok


async def _turn_two(http: aiohttp.ClientSession, s: Stack, conversation: str, first: bytes) -> tuple[int, str]:
    """The conversation's second turn (after a served first), and its reuse outcome."""
    data = orjson.loads(first)
    msgs = [user(LONG), assistant(data["choices"][0]["message"]["content"]), user("and then?")]
    status, headers, raw = await _post(http, s, {"model": "Qwen", "messages": msgs, "conversation_id": conversation})
    if status != 200:
        TALLY.lost += 1
    _clean(s, raw)
    return status, headers.get("X-PDX-Reuse", "")


# ---------------------------------------------------------------- malformed engine answers

ANSWERS = ["not_json", "wrong_content_type", "truncated_stream", "oversized_body", "json_not_object"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("malform", ANSWERS)
async def test_a_malformed_prefill_answer_is_a_clean_502(
    make_stack: StackFactory, http: aiohttp.ClientSession, malform: str, stream: bool
) -> None:
    s = await make_stack(prefill_opts={"malform": malform, "malform_bytes": 1 << 16})
    s.router.upstream.max_answer_bytes = 8192
    body = {"model": "Qwen", "messages": [user(LONG)], "stream": stream, "conversation_id": "c1"}
    status, headers, raw = await _post(http, s, body)
    assert status == 502 and headers["Content-Type"].startswith("application/json")
    assert _error_message(raw) == "the prefill engine's answer was malformed"  # the detail: in the log
    _clean(s, raw)
    TALLY.expected_errors += 1
    assert s.decode.requests == [] and _entries(s) == {}
    assert s.prefill.opts.malform is not None
    assert _metric(s, "pdx_router_upstream_errors_total", role="prefill") >= 1
    assert _metric(s, "pdx_router_requests_total", route=CHAT, status="502") == 1
    assert s.router.pool.endpoints[0].healthy  # it answered: it is not taken out
    _record(f"prefill {malform} ({'stream' if stream else 'json'})", await _next_turn_served(http, s, "c2", stream))


@pytest.mark.parametrize("shape", list(BAD_KV))
async def test_prefill_kv_of_the_wrong_shape_never_reaches_decode(
    make_stack: StackFactory, http: aiohttp.ClientSession, shape: str, caplog: pytest.LogCaptureFixture
) -> None:
    s = await make_stack(prefill_opts={"malform": "kv_wrong_shape", "bad_kv": BAD_KV[shape]})
    body = {"model": "Qwen", "messages": [user(LONG)], "conversation_id": "c1"}
    status, _, raw = await _post(http, s, body)
    assert status == 502, raw
    assert _error_message(raw) == "the prefill engine's answer was malformed"
    assert "kv_transfer_params of the wrong shape" in caplog.text
    _clean(s, raw)
    TALLY.expected_errors += 1
    assert s.decode.requests == [] and _entries(s) == {}
    _record(f"prefill kv {shape}", await _next_turn_served(http, s, "c2", False))


@pytest.mark.parametrize("malform", ANSWERS)
async def test_a_malformed_decode_answer_is_a_clean_502(
    make_stack: StackFactory, http: aiohttp.ClientSession, malform: str
) -> None:
    s = await make_stack(decode_opts={"malform": malform, "malform_bytes": 1 << 16})
    s.router.upstream.max_answer_bytes = 8192
    body = {"model": "Qwen", "messages": [user(LONG)], "conversation_id": "c1"}
    status, _, raw = await _post(http, s, body)
    assert status == 502
    assert _error_message(raw) == "the decode engine's answer was malformed"
    _clean(s, raw)
    TALLY.expected_errors += 1
    assert _entries(s) == {} and len(s.decode.requests) == 1  # not retried: decode answered
    assert _metric(s, "pdx_router_upstream_errors_total", role="decode") >= 1
    assert all(e.healthy for e in s.router.pool.endpoints)
    _record(f"decode {malform} (json)", await _next_turn_served(http, s, "c2", False))


STREAMS = {
    # what the client sees: a clean 502 before the stream, or the stream's readable part, an
    # error event naming it and no [DONE]
    "not_json": "a line that is not readable JSON",
    "truncated_stream": "it ended before [DONE]",
    "oversized_body": "a line above the size limit",
    "json_not_object": "a line that is not readable JSON",
    "junk_after_kv": "a line that is not readable JSON",  # in the block that holds the kv
}


@pytest.mark.parametrize("malform", [*STREAMS, "wrong_content_type"])
async def test_a_malformed_decode_stream_ends_with_an_error_event(
    make_stack: StackFactory, http: aiohttp.ClientSession, malform: str
) -> None:
    s = await make_stack(decode_opts={"malform": malform, "malform_bytes": 1 << 20})
    s.router.upstream.max_answer_bytes = 8192
    body = {"model": "Qwen", "messages": [user(LONG)], "stream": True, "conversation_id": "c1"}
    status, headers, raw = await _post(http, s, body)
    _clean(s, raw)
    TALLY.expected_errors += 1
    if malform == "wrong_content_type":  # JSON to a streamed request: nothing relayed
        assert status == 502
        assert _error_message(raw) == "the decode engine's answer was malformed"
    else:
        assert status == 200 and headers["Content-Type"] == "text/event-stream"
        events = _events(raw)
        assert "[DONE]" not in events
        assert events[-1]["error"]["message"] == f"the decode engine's stream was malformed: {STREAMS[malform]}"
        assert all("padding" not in str(e) for e in events)
    assert _entries(s) == {}
    assert _metric(s, "pdx_router_upstream_errors_total", role="decode") >= 1
    _record(f"decode {malform} (stream)", await _next_turn_served(http, s, "c2", True))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("shape", list(BAD_KV))
async def test_decode_kv_of_the_wrong_shape_is_never_stored_nor_attached_later(
    make_stack: StackFactory, http: aiohttp.ClientSession, shape: str, stream: bool
) -> None:
    """The answer itself is fine (decode generated it): the client gets it, the kv is cut out
    of it, and nothing is kept, so the next turn is a miss and no prefill sees that kv."""
    s = await make_stack(decode_opts={"malform": "kv_wrong_shape", "bad_kv": BAD_KV[shape]})
    body = {"model": "Qwen", "messages": [user(LONG)], "stream": stream, "conversation_id": "c1"}
    status, _, raw = await _post(http, s, body)
    assert status == 200
    _clean(s, raw)
    if stream:
        assert _events(raw)[-1] == "[DONE]"
    assert _entries(s) == {}
    s.decode.opts.malform = None
    msgs = [user(LONG), assistant("w1"), user("and then?")]
    status2, headers2, raw2 = await _post(http, s, {"model": "Qwen", "messages": msgs, "conversation_id": "c1"})
    _clean(s, raw2)
    assert status2 == 200 and headers2["X-PDX-Reuse"] == "miss"
    bad = orjson.dumps(BAD_KV[shape])
    assert all(orjson.dumps(b.get("kv_transfer_params")) != bad for _, b in s.prefill.requests)
    assert s.cluster.reads == []
    _count_reads(s)
    _record(f"decode kv {shape} ({'stream' if stream else 'json'})", status2 == 200)


async def test_a_stream_cut_mid_line_keeps_the_router_serving_the_same_conversation(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    """The cut turn leaves nothing; the conversation's retry starts over as a miss, reuses
    on its next turn, and every read prefill makes is of KV decode holds."""
    s = await make_stack(decode_opts={"malform": "truncated_stream"})
    body = {"model": "Qwen", "messages": [user(LONG)], "stream": True, "conversation_id": "c1"}
    status, _, raw = await _post(http, s, body)
    assert status == 200 and "[DONE]" not in _events(raw)
    s.decode.opts.malform = None
    status, headers, first = await _post(http, s, {**body, "stream": False})
    assert status == 200 and headers["X-PDX-Reuse"] == "miss"
    status, outcome = await _turn_two(http, s, "c1", first)
    assert (status, outcome) == (200, "hit")
    assert s.cluster.reads and all(r.correct for r in s.cluster.reads)
    _count_reads(s)
    _record("decode stream cut mid-line, same conversation", True)


# ---------------------------------------------------------------- bad client input

VICTIM = "victim"
MALLORY = {"Authorization": "Bearer mallory"}


async def _with_victim(make_stack: StackFactory, http: aiohttp.ClientSession, **cfg: Any) -> tuple[Stack, bytes]:
    """A stack holding another client's conversation entry, that bad input must not touch."""
    s = await make_stack(**cfg)
    status, _, first = await _post(http, s, {"model": "Qwen", "messages": [user(LONG)], "conversation_id": VICTIM})
    assert status == 200 and _key(s, VICTIM) in _entries(s)
    return s, first


async def _victim_untouched(http: aiohttp.ClientSession, s: Stack, before: dict[str, Entry], first: bytes) -> bool:
    """The other conversation's entry is the one it stored, and its next turn reuses it."""
    assert _entries(s)[_key(s, VICTIM)] == before[_key(s, VICTIM)]
    status, outcome = await _turn_two(http, s, VICTIM, first)
    _count_reads(s)
    return status == 200 and outcome == "hit" and all(r.correct for r in s.cluster.reads)


BODIES: dict[str, tuple[bytes, str]] = {
    "list": (b"[1, 2]", "request body must be a JSON object"),
    "string": (b'"hello"', "request body must be a JSON object"),
    "number": (b"5", "request body must be a JSON object"),
    "null": (b"null", "request body must be a JSON object"),
    "empty": (b"", "request body is not valid JSON"),
    "invalid_utf8": (b'{"model": "Qwen", "messages": [{"role": "user", "content": "\xff\xfe"}]}', "not valid JSON"),
    "lone_surrogate": (b'{"model": "Qwen", "messages": [{"role": "user", "content": "\\ud800"}]}', "not valid JSON"),
    "truncated": (b'{"model": "Qwen", "messages": [', "request body is not valid JSON"),
}


@pytest.mark.parametrize("case", list(BODIES))
async def test_a_body_that_is_not_a_json_object_is_a_400(
    make_stack: StackFactory, http: aiohttp.ClientSession, case: str
) -> None:
    s, first = await _with_victim(make_stack, http)
    before = _entries(s)
    raw_body, message = BODIES[case]
    status, _, raw = await _post(http, s, raw_body, MALLORY)
    assert status == 400 and message in _error_message(raw)
    _clean(s, raw)
    assert len(s.prefill.requests) == 1  # the victim's first turn only
    assert _metric(s, "pdx_router_requests_total", route=CHAT, status="400") == 1
    _record(f"client body {case}", await _victim_untouched(http, s, before, first))


async def test_a_body_over_the_limit_is_a_413(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    s, first = await _with_victim(make_stack, http, max_request_bytes=16384)
    before = _entries(s)
    big = {"model": "Qwen", "messages": [user("x" * 20000)], "conversation_id": VICTIM}
    status, _, raw = await _post(http, s, big, MALLORY)
    assert status == 413
    _clean(s, raw)
    assert len(s.prefill.requests) == 1
    _record("client body over maxRequestBytes", await _victim_untouched(http, s, before, first))


WRONG_TYPES: dict[str, tuple[dict[str, Any], str]] = {
    "messages_missing": ({}, "messages: required, a list of message objects"),
    "messages_string": ({"messages": "hi"}, "messages: must be a list of message objects, not a string"),
    "messages_object": ({"messages": {"role": "user"}}, "messages: must be a list of message objects, not an object"),
    "messages_null": ({"messages": None}, "messages: required, a list of message objects"),
    "message_string": ({"messages": ["hi"]}, "messages[0]: must be an object with role and content, not a string"),
    "message_number": (
        {"messages": [user("a"), 5]},
        "messages[1]: must be an object with role and content, not the number 5",
    ),
    "message_null": ({"messages": [None]}, "messages[0]: must be an object with role and content, not null"),
    "max_tokens_string": ({"max_tokens": "16"}, "max_tokens: must be a non-negative integer or null, not a string"),
    "max_tokens_negative": (
        {"max_tokens": -1},
        "max_tokens: must be a non-negative integer or null, not the number -1",
    ),
    "max_tokens_float": ({"max_tokens": 2.5}, "max_tokens: must be a non-negative integer or null, not the number 2.5"),
    "max_tokens_bool": ({"max_tokens": True}, "max_tokens: must be a non-negative integer or null, not a boolean"),
    "max_completion_tokens_list": (
        {"max_completion_tokens": [4]},
        "max_completion_tokens: must be a non-negative integer or null, not an array",
    ),
    "stream_false_string": ({"stream": "false"}, "stream: must be a boolean (true or false), not a string"),
    "stream_zero_string": ({"stream": "0"}, "stream: must be a boolean (true or false), not a string"),
    "stream_no": ({"stream": "no"}, "stream: must be a boolean (true or false), not a string"),
    "stream_zero": ({"stream": 0}, "stream: must be a boolean (true or false), not the number 0"),
    "stream_one": ({"stream": 1}, "stream: must be a boolean (true or false), not the number 1"),
    "stream_list": ({"stream": []}, "stream: must be a boolean (true or false), not an array"),
    "return_token_ids_string": (
        {"return_token_ids": "false"},
        "return_token_ids: must be a boolean (true or false), not a string",
    ),
    "conversation_number": ({"conversation_id": 7}, "conversation_id: must be a string, not the number 7"),
    "conversation_list": ({"conversation_id": [VICTIM]}, "conversation_id: must be a string, not an array"),
    "conversation_object": ({"conversation_id": {"id": VICTIM}}, "conversation_id: must be a string, not an object"),
    "conversation_bool": ({"conversation_id": True}, "conversation_id: must be a string, not a boolean"),
}


@pytest.mark.parametrize("case", list(WRONG_TYPES))
async def test_a_field_of_the_wrong_type_is_a_400_naming_it(
    make_stack: StackFactory, http: aiohttp.ClientSession, case: str
) -> None:
    s, first = await _with_victim(make_stack, http)
    before = _entries(s)
    change, message = WRONG_TYPES[case]
    body = {"model": "Qwen", "messages": [user(LONG)], "conversation_id": VICTIM, **change}
    if case == "messages_missing":
        del body["messages"]
    status, _, raw = await _post(http, s, body, MALLORY)
    assert status == 400 and _error_message(raw) == message
    _clean(s, raw)
    assert len(s.prefill.requests) == 1
    _record(f"client {case}", await _victim_untouched(http, s, before, first))


async def test_a_completion_prompt_of_the_wrong_type_is_a_400(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s, first = await _with_victim(make_stack, http)
    before = _entries(s)
    status, _, raw = await _post(http, s, {"model": "Qwen", "prompt": 5}, MALLORY, path="/v1/completions")
    assert status == 400 and _error_message(raw) == "prompt: must be a string or a list, not the number 5"
    _record("client prompt number", await _victim_untouched(http, s, before, first))


@pytest.mark.parametrize("stream", [None, False, True])
async def test_stream_null_is_false_and_booleans_are_honoured(
    make_stack: StackFactory, http: aiohttp.ClientSession, stream: bool | None
) -> None:
    s = await make_stack()
    status, headers, raw = await _post(http, s, {"model": "Qwen", "messages": [user(LONG)], "stream": stream})
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream" if stream else "application/json")
    _clean(s, raw)
    assert s.decode.requests[0][1].get("stream") is stream
    _record(f"client stream {stream}", True)


# ---------------------------------------------------------------- conversation ids

IDS = {
    "10kb": "x" * 10240,
    "unicode": "会话-🙂-ñ",
    "control": "a\x00b\n\t\x1b[31m",
    "quotes_and_escapes": '"}\\u0000{"kv_transfer_params":',
    "spaces": "   ",
}


@pytest.mark.parametrize("case", list(IDS))
async def test_a_conversation_id_of_any_length_and_charset_reuses(
    make_stack: StackFactory, http: aiohttp.ClientSession, case: str
) -> None:
    s, first_v = await _with_victim(make_stack, http)
    before = _entries(s)
    cid = IDS[case]
    status, _, first = await _post(http, s, {"model": "Qwen", "messages": [user(LONG)], "conversation_id": cid})
    assert status == 200 and _key(s, cid) in _entries(s)
    _clean(s, first)
    status, outcome = await _turn_two(http, s, cid, first)
    assert (status, outcome) == (200, "hit")
    _record(f"conversation id {case} (body)", await _victim_untouched(http, s, before, first_v))


async def test_an_empty_conversation_id_is_plain_pd(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    # With ids only; by default a request without an id is found by its history (test_history_reuse).
    s, first_v = await _with_victim(make_stack, http, conversation_from="id")
    before = _entries(s)
    for body_id, header in (("", None), (None, ""), ("", "")):
        body: dict[str, Any] = {"model": "Qwen", "messages": [user(LONG)]}
        if body_id is not None:
            body["conversation_id"] = body_id
        status, headers, raw = await _post(http, s, body, {"X-Session-ID": header} if header is not None else {})
        assert status == 200 and headers["X-PDX-Reuse"] == "none"
        _clean(s, raw)
    assert _entries(s).keys() == before.keys()
    _record("conversation id empty", await _victim_untouched(http, s, before, first_v))


async def _raw_post(s: Stack, body: bytes, headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes]:
    """A request written byte for byte (header values aiohttp's client would refuse to send)."""
    host, port = s.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += b"".join(k + b": " + v + b"\r\n" for k, v in headers)
    head += b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n"
    writer.write(head + body)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    TALLY.turns += 1
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


HEADER_IDS = {
    "unicode_utf8": "会话-🙂".encode(),
    "latin1_not_utf8": b"caf\xe9",
    "tab_inside": b"a\tb",
    "4kb": b"y" * 4096,
}


@pytest.mark.parametrize("case", list(HEADER_IDS))
async def test_an_x_session_id_of_any_bytes_reuses(
    make_stack: StackFactory, http: aiohttp.ClientSession, case: str
) -> None:
    s, first_v = await _with_victim(make_stack, http)
    before = _entries(s)
    sid = HEADER_IDS[case]
    body = orjson.dumps({"model": "Qwen", "messages": [user(LONG)]})
    status, first = await _raw_post(s, body, [(b"X-Session-ID", sid)])
    assert status == 200, first
    _clean(s, first)
    msgs = [user(LONG), assistant(orjson.loads(first)["choices"][0]["message"]["content"]), user("and then?")]
    status, _ = await _raw_post(s, orjson.dumps({"model": "Qwen", "messages": msgs}), [(b"X-Session-ID", sid)])
    assert status == 200
    assert len(s.cluster.reads) == 1 and s.cluster.reads[0].correct  # the second turn reused
    _record(f"conversation id {case} (header)", await _victim_untouched(http, s, before, first_v))


@pytest.mark.parametrize("value", [b"z" * 10240, b"a\x01b", b"a\x7fb"])
async def test_an_x_session_id_the_server_refuses_is_a_clean_4xx(make_stack: StackFactory, value: bytes) -> None:
    """Above the server's header line size (8190 bytes): 431; with a control character HTTP
    forbids: 400. Both before the router reads anything."""
    s = await make_stack()
    status, raw = await _raw_post(
        s, orjson.dumps({"model": "Qwen", "messages": [user(LONG)]}), [(b"X-Session-ID", value)]
    )
    assert status == (431 if len(value) > 8190 else 400), raw
    _clean(s, raw)
    _record(f"X-Session-ID of {len(value)} bytes with {value[1:2]!r}", True)


# ---------------------------------------------------------------- odd places


async def test_kv_and_conversation_in_odd_places_never_reach_another_entry(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    # With ids only: a request whose id is nowhere the router reads one is plain P/D.
    s, first_v = await _with_victim(make_stack, http, conversation_from="id")
    before = _entries(s)
    evil = orjson.dumps(EVIL).decode()
    base = f'"model": "Qwen", "messages": [{{"role": "user", "content": "{LONG}"}}]'
    cases: list[tuple[str, bytes, dict[str, str]]] = [
        (
            "kv in a message",
            orjson.dumps({"model": "Qwen", "messages": [{**user(LONG), "kv_transfer_params": EVIL}]}),
            {},
        ),
        ("kv as a list", orjson.dumps({"model": "Qwen", "messages": [user(LONG)], "kv_transfer_params": [EVIL]}), {}),
        ("kv as a string", orjson.dumps({"model": "Qwen", "messages": [user(LONG)], "kv_transfer_params": evil}), {}),
        (
            "kv in vllm_xargs",
            orjson.dumps(
                {"model": "Qwen", "messages": [user(LONG)], "vllm_xargs": {"kv_transfer_params": evil, "x": 1}}
            ),
            {},
        ),
        (
            "kv in a header",
            orjson.dumps({"model": "Qwen", "messages": [user(LONG)]}),
            {"kv_transfer_params": evil, "X-KV-Transfer-Params": evil},
        ),
        (
            "kv twice in the raw JSON",
            f'{{{base}, "kv_transfer_params": {evil}, "kv_transfer_params": {evil}}}'.encode(),
            {},
        ),
        (
            "conversation in a message",
            orjson.dumps({"model": "Qwen", "messages": [{**user(LONG), "conversation_id": VICTIM}]}),
            {},
        ),
        (
            "conversation in another header",
            orjson.dumps({"model": "Qwen", "messages": [user(LONG)]}),
            {"conversation_id": VICTIM, "X-Conversation-ID": VICTIM},
        ),
    ]
    for name, raw_body, headers in cases:
        TALLY.turns += 1
        async with http.post(
            s.url + CHAT, data=raw_body, headers={**MALLORY, "Content-Type": "application/json", **headers}
        ) as r:
            raw = await r.read()
            assert r.status == 200, (name, raw)
            assert r.headers["X-PDX-Reuse"] == "none", name
        _clean(s, raw)
        _record(f"odd place: {name}", True)
    # duplicated conversation ids: the last one counts, as in the engines' own parser, and it
    # is this tenant's own conversation either way
    dup = f'{{{base}, "conversation_id": "{VICTIM}", "conversation_id": "mine"}}'.encode()
    status, _, raw = await _post(http, s, dup, MALLORY)
    assert status == 200 and _key(s, "mine", MALLORY["Authorization"]) in _entries(s)
    _record("odd place: conversation id twice in the raw JSON", True)
    for _, body in s.prefill.requests + s.decode.requests:
        kv = body.get("kv_transfer_params") or {}
        assert kv.get("remote_host") != "169.254.169.254" and kv.get("remote_request_id") != "someone-elses"
        assert "kv_transfer_params" not in (body.get("vllm_xargs") or {})
    assert s.cluster.reads == []
    _record("odd places: the other conversation", await _victim_untouched(http, s, before, first_v))


# ---------------------------------------------------------------- the pure parts


def test_well_formed_kv_admits_vllms_forms_and_nothing_else() -> None:
    decode_kv = {
        "do_remote_prefill": False,
        "do_remote_decode": True,
        "remote_block_ids": [[1, 2, 3, 4, 5, 6, 7, 8]],
        "remote_engine_id": "local-decode-0-local43263",
        "remote_request_id": "chatcmpl-8e326264c33415b4-89520815",
        "remote_host": "127.0.0.1",
        "remote_port": 41039,
        "remote_num_tokens": 989,
        "remote_blocks_expiry_time": 20921.77324235,
        "transfer_mode": "pull",
    }
    fresh = {"do_remote_decode": True, "remote_block_ids": None, "remote_host": None, "remote_port": None}
    assert well_formed_kv(decode_kv) and well_formed_kv(fresh) and well_formed_kv({})
    assert well_formed_kv({**decode_kv, "remote_block_ids": [[1, 2], [3, 4]], "unknown": [1]})
    assert not any(well_formed_kv(bad) for bad in BAD_KV.values())
    assert not well_formed_kv(None)


def test_request_problem_admits_what_a_client_may_send() -> None:
    ok: list[dict[str, Any]] = [
        {"messages": [user("x")]},
        {"messages": [], "stream": None, "max_tokens": None},
        {"messages": [user("x")], "stream": True, "max_tokens": 0, "max_completion_tokens": 16},
        {"messages": [user("x")], "conversation_id": "", "n": 2},
    ]
    assert [request_problem(b, True) for b in ok] == [None] * len(ok)
    for prompt in ("text", [1, 2], ["a", "b"], [[1, 2]]):
        assert request_problem({"prompt": prompt}, False) is None
    assert request_problem({}, False) is None  # a completion without a prompt: the engine's to judge
    for change, message in WRONG_TYPES.values():
        body = {"messages": [user("x")], **change}
        if not change:  # messages_missing
            del body["messages"]
        assert request_problem(body, True) == message


def test_the_stream_filter_drops_what_it_cannot_read_and_stops_there() -> None:
    kv = orjson.dumps(EVIL)
    # a JSON answer where a stream was expected: not a data line, yet it carries kv
    f = StreamFilter(capture=True, strip_ids=True)
    assert f.feed(b'{"choices":[],"kv_transfer_params":' + kv + b"}\n") == b""
    assert f.dropped == 1 and f.captured.kv is None
    # a data line holding an array
    f = StreamFilter(capture=True, strip_ids=True)
    assert f.feed(b'data: [{"kv_transfer_params":' + kv + b"}]\n\n") == b"\n"
    assert f.dropped == 1 and f.captured.kv is None
    # a last line cut short without its line end, that names no field: still dropped
    f = StreamFilter(capture=True, strip_ids=True)
    assert f.feed(b'data: {"id":"x","choices":[]}\n\ndata: {"id":"cmpl-de') == b'data: {"id":"x","choices":[]}\n\n'
    assert f.flush() == b"" and f.dropped == 1
    # the relay's mode: nothing after a dropped line, not even [DONE]
    f = StreamFilter(capture=True, strip_ids=True)
    f.stop_at_drop = True
    out = f.feed(b'data: {"a":1}\n\ndata: {"kv_transfer_params":' + kv + b",}\n\ndata: [DONE]\n\n")
    assert out == b'data: {"a":1}\n\n' and f.dropped == 1
    # a line longer than the limit: dropped, and the rest of the stream with it
    f = StreamFilter(capture=True, strip_ids=True)
    f.max_line_bytes = 100
    assert f.feed(b'data: {"a":1}\n\ndata: {"pad":"' + b"x" * 200) == b'data: {"a":1}\n\n'
    assert f.oversized and f.feed(b'"}\n\ndata: [DONE]\n\n') == b"" and f.flush() == b""
