"""The history digests that find a conversation without an id (policy/history.py)."""

from __future__ import annotations

import time
from typing import Any

import orjson

from pdx_contract.router_config import TenancyConfig
from pdx_router.policy import history, shapes

T, S = "a" * 32, "b" * 32
LONG_TEXT = " ".join(f"word{i}" for i in range(2000))


def u(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def a(text: str | None, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **extra}


def test_the_next_request_names_the_stored_turn_first() -> None:
    sent = [{"role": "system", "content": "be brief"}, u("hi")]
    stored = history.of_messages(sent).turn(history.answer_message("hello", None))
    follow = history.of_messages([*sent, a("hello"), u("more")])
    assert follow.lookup[0] == stored


def test_the_longest_prefix_is_tried_first_one_key_per_assistant_turn() -> None:
    msgs = [u("1"), a("x"), u("2"), a("y"), u("3")]
    h = history.of_messages(msgs)
    assert len(h.lookup) == 2
    assert h.lookup[0] == history.of_messages(msgs[:3]).turn(a("y"))
    assert h.lookup[1] == history.of_messages(msgs[:1]).turn(a("x"))


def test_content_as_text_parts_or_string_reads_the_same() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert history.canonical(u("a\nb")) == history.canonical({"role": "user", "content": parts})
    assert history.canonical(a(None)) == history.canonical({"role": "assistant"})
    assert history.canonical(a("")) == history.canonical(a(None))


def test_reasoning_and_unknown_fields_do_not_count() -> None:
    assert history.canonical(a("x", reasoning_content="think")) == history.canonical(a("x"))


def test_an_edited_assistant_message_names_another_turn() -> None:
    stored = history.of_messages([u("hi")]).turn(a("hello"))
    assert history.of_messages([u("hi"), a("hello!"), u("more")]).lookup[0] != stored


def test_tool_calls_and_results_by_call_id() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    other = {"id": "c2", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    assert history.canonical(a(None, tool_calls=[call])) != history.canonical(a(None, tool_calls=[other]))
    r1 = {"role": "tool", "tool_call_id": "c1", "content": "42"}
    r2 = {"role": "tool", "tool_call_id": "c2", "content": "42"}
    assert history.canonical(r1) != history.canonical(r2)
    stored = history.of_messages([u("q")]).turn(history.answer_message(None, [call]))
    assert history.of_messages([u("q"), a(None, tool_calls=[call]), r1]).lookup[0] == stored


def test_roles_and_order_matter() -> None:
    assert history.of_messages([u("x"), a("y")]).head != history.of_messages([a("x"), a("y")]).head
    assert history.of_messages([u("x"), u("y")]).head != history.of_messages([u("y"), u("x")]).head


def test_thousands_of_messages_try_a_bounded_number_of_keys_in_linear_time() -> None:
    msgs = [m for i in range(5000) for m in (u(f"q{i}"), a(f"r{i}"))]
    t0 = time.perf_counter()
    h = history.of_messages(msgs)
    elapsed = time.perf_counter() - t0
    assert len(h.lookup) == history.MAX_KEYS
    assert h.lookup[0] == history.of_messages(msgs[:-1]).turn(msgs[-1])
    assert elapsed < 1.0  # ~10k messages: a few tens of ms


def test_keys_are_bound_to_tenant_and_scope_and_no_id_names_one() -> None:
    d = history.of_messages([u("hi"), a("x")]).lookup[0]
    k = history.key(T, S, d)
    assert k != history.key("c" * 32, S, d)
    assert k != history.key(T, "c" * 32, d)
    assert k != shapes.entry_key(T, d.hex(), S)
    assert k != shapes.entry_key(T, "\x01" + d.hex(), S)


def test_a_streamed_answer_with_tool_calls_names_the_turn_the_client_sends_back() -> None:
    from pdx_router.answer import StreamedAnswer

    def event(delta: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": delta}]}) + b"\n\n"

    said = StreamedAnswer()
    said.feed(event({"role": "assistant", "content": ""}) + event({"content": "let me"}))
    start = {"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}
    said.feed(event({"content": " look"}) + event({"tool_calls": [start]}))
    said.feed(event({"tool_calls": [{"index": 0, "function": {"arguments": '{"x": '}}]}))
    said.feed(event({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}) + b"data: [DONE]\n\n")
    sent = a(
        "let me look", tool_calls=[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]
    )
    message = said.message()
    assert message is not None and history.canonical(message) == history.canonical(sent)


def test_an_unreadable_streamed_line_leaves_the_answer_unknown() -> None:
    from pdx_router.answer import StreamedAnswer

    said = StreamedAnswer()
    said.feed(b'data: {"choices": [{"delta": {"content": "x"\n\n')
    assert said.message() is None


def test_compact_text_events_read_by_byte_search_give_what_parsing_gives() -> None:
    from pdx_router.answer import StreamedAnswer

    texts = ["plain ", 'a "quoted" word', "tab\there", "ü and 中文 ", "", "back\\slash", '"content": x']
    events = [
        b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": {"content": t}, "finish_reason": None}]}) + b"\n\n"
        for t in texts
    ]
    spaced = b'data: {"choices": [{"index": 0, "delta": {"content" : "spaced"}}]}\n\n'
    for blocks in ([*events, spaced], [b"".join(events[:3]), b"".join(events[3:]) + spaced]):
        said = StreamedAnswer()
        for block in blocks:
            said.feed(block)
        message = said.message()
        assert message is not None and message["content"] == "".join(texts) + "spaced"


def test_a_long_streamed_answer_is_read_in_batches_as_a_whole() -> None:
    from pdx_router.answer import StreamedAnswer

    def event(delta: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}) + b"\n\n"

    words = [f"w{i} " for i in range(20_000)]
    said = StreamedAnswer()
    said.feed(event({"role": "assistant", "content": ""}))
    for i, w in enumerate(words):
        said.feed(event({"content": w}) if i != 7_000 else event({"content": w, "reasoning_content": None}))
    said.feed(event({"content": None}) + b"data: [DONE]\n\n")
    message = said.message()
    assert message is not None and message["content"] == "".join(words)


def test_whitespace_around_a_messages_text_does_not_count() -> None:
    assert history.canonical(a(" answer\n")) == history.canonical(a("answer"))
    assert history.canonical(a("an swer")) != history.canonical(a("answer"))


def test_digests_stay_what_earlier_routers_stored() -> None:
    """Replicas of two versions share a Redis store during a rollout: a digest that changed
    would miss every turn the other version kept (these are the first release's values)."""
    msgs = [
        {"role": "system", "content": "be brief"},
        u(" hi "),
        a("hello", tool_calls=[{"id": "c1", "function": {"name": "f", "arguments": {"x": 1}}}]),
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "42"}]},
        a(None),
        u("more"),
    ]
    got = history.of_messages(msgs)
    assert [d.hex() for d in got.lookup] == ["2787a4aca6d9804931cbf4408d7311be", "8b80ea40e30522a5e4d89cf6c1b064a8"]
    assert got.head.hex() == "e10b2ff9985d61ca43f787f210452320"


def test_the_pass_gives_the_digest_through_the_first_user_message_as_a_pass_over_it_alone() -> None:
    msgs = [{"role": "system", "content": "be brief"}, u(LONG_TEXT), a("ok"), u("more"), a("fine"), u("again")]
    got = history.of_messages(msgs)
    assert got.first_user == history.of_messages(msgs[:2]).head
    assert history.of_messages([{"role": "system", "content": "s"}, a("no user")]).first_user is None


def test_prefill_affinity_of_a_history_turn_is_the_key_a_second_pass_gives() -> None:
    msgs = [{"role": "system", "content": "be brief"}, u(LONG_TEXT), a("ok"), u("more")]
    front = shapes.Front(tenancy=TenancyConfig(identity="single"), prefill_affinity=True)
    ask = shapes.client_request({"model": "m", "messages": msgs}, {}, "/v1/chat/completions", True, front)
    assert ask.history is not None and ask.tenant is not None and ask.scope is not None
    second_pass = shapes.affinity_key(None, {"messages": msgs}, True, ask.tenant, ask.scope)
    assert ask.affinity == second_pass == history.key(ask.tenant, ask.scope, history.of_messages(msgs[:2]).head)
