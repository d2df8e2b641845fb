"""The client against a fake streaming server on loopback: timing, headers, ids, history."""

from __future__ import annotations

import aiohttp
import pytest

from pdx_bench.client import chat, request_body, run
from pdx_bench.enginemetrics import EngineScraper, parse_totals
from pdx_bench.workload import WorkloadSpec, build

from .fakeserver import FakeRouter, serve


async def test_one_request_measures_and_reads_headers() -> None:
    fake = FakeRouter(first_token_delay=0.08, token_delay=0.01)
    body = request_body("m", [{"role": "user", "content": "hello there"}], "conv-1", max_tokens=5, min_tokens=5)
    async with serve(fake) as url, aiohttp.ClientSession() as s:
        reply = await chat(s, url, body, "conv-1")
    assert reply.ok, reply.error
    assert 80 <= reply.ttft_ms < reply.latency_ms
    assert reply.latency_ms >= 80 + 4 * 10
    assert reply.content == " w1x0 w1x1 w1x2 w1x3 w1x4"
    assert reply.first_chunk == " w1x0" and reply.content_chunks == 4
    assert reply.prompt_tokens == fake.prompt_tokens(fake.bodies[0]) and reply.completion_tokens == 5
    assert (reply.prefill_ms, reply.reuse, reply.reused_tokens) == (40.0, "miss", 0)
    sent = fake.bodies[0]
    assert sent["conversation_id"] == "conv-1" and fake.headers[0]["X-Session-ID"] == "conv-1"
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert sent["temperature"] == 0 and sent["max_tokens"] == 5 and sent["min_tokens"] == 5


async def test_the_steady_tpot_leaves_out_the_gap_before_the_second_token() -> None:
    # As with prefill's first token: decode's whole hop lies between the first two tokens.
    fake = FakeRouter(first_token_delay=0.01, second_token_delay=0.3, token_delay=0.01)
    w = build(WorkloadSpec(prefix_tokens=50, turns=1, conversations=1, output_tokens=8), label="t")
    async with serve(fake) as url, aiohttp.ClientSession() as s:
        res = await run(s, url, "fake-model", w)
    (rec,) = res.records
    assert rec.steady_tpot_ms is not None and 10 <= rec.steady_tpot_ms < 30  # 6 gaps of 10 ms after the second
    assert rec.tpot_ms > 45  # (300 + 6 * 10) / 7 ms: the gap counted in


async def test_workload_run_records_history_and_per_request_transfer() -> None:
    fake = FakeRouter(first_token_delay=0.01, token_delay=0.0)
    spec = WorkloadSpec(prefix_tokens=50, turns=3, conversations=2, user_tokens=5, tool_tokens=7, output_tokens=4)
    w = build(spec, label="t")
    done: list[object] = []
    async with serve(fake) as url, aiohttp.ClientSession() as s:
        scraper = EngineScraper(s, {"prefill": [url]})
        res = await run(s, url, "fake-model", w, scraper=scraper, leg="on", on_done=done.append)
    assert res.errors == [] and len(res.records) == 6 and len(done) == 6
    by_conv: dict[str, list[dict[str, object]]] = {}
    for b in fake.bodies:
        by_conv.setdefault(str(b["conversation_id"]), []).append(b)
    assert set(by_conv) == {c.conversation_id for c in w.conversations}
    for conv in w.conversations:
        bodies = by_conv[conv.conversation_id]
        # Turn 3 re-sends turn 1 and 2 with the answers streamed back, in order.
        msgs = bodies[2]["messages"]
        assert isinstance(msgs, list)
        assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
        assert msgs[2]["content"] == " w1x0 w1x1 w1x2 w1x3" and msgs[4]["content"] == " w2x0 w2x1 w2x2 w2x3"
    for rec in res.records:
        assert rec.leg == "on" and rec.prefix_tokens == 50 and rec.output_num_tokens == 4
        assert rec.input_num_turns == 2 * rec.turn
        assert rec.ttft_ms >= 10 and rec.latency_ms >= rec.ttft_ms
        assert rec.kv_transfer_source == "request"
        if rec.turn == 1:
            assert rec.reuse == "miss" and rec.kv_transfer_ms == 0.0 and rec.prefill_ms == 40.0
        else:
            assert rec.reuse == "hit" and rec.reused_tokens == 96
            assert rec.kv_transfer_ms == pytest.approx(4.0) and rec.kv_transfer_bytes == pytest.approx(1024.0)
    # input_num_tokens is the engine's usage.prompt_tokens, which grows turn over turn.
    one = sorted(
        (r for r in res.records if r.conversation_id == w.conversations[0].conversation_id), key=lambda r: r.turn
    )
    assert [r.input_num_tokens for r in one] == sorted({r.input_num_tokens for r in one})
    conv0 = w.conversations[0]
    for rec in one:
        # vLLM's definition: share of the prompt that is history, i.e. not the new user message.
        question = conv0.turns[rec.turn - 1].tokens
        assert rec.approx_cached_percent == pytest.approx(
            100 * (rec.input_num_tokens - question) / rec.input_num_tokens
        )


async def test_a_failed_turn_ends_its_conversation_and_is_reported() -> None:
    fake = FakeRouter(first_token_delay=0.0, token_delay=0.0, fail_turn=2)
    w = build(WorkloadSpec(prefix_tokens=10, turns=3, conversations=1, user_tokens=3, tool_tokens=3, output_tokens=2))
    done: list[object] = []
    async with serve(fake) as url, aiohttp.ClientSession() as s:
        res = await run(s, url, "m", w, on_done=done.append)
    assert [r.turn for r in res.records] == [1]
    assert len(res.errors) == 1 and res.errors[0]["turn"] == 2 and res.errors[0]["status"] == 500
    assert len(fake.bodies) == 2  # turn 3 was never sent
    assert len(done) == 3 and done.count(None) == 2  # the progress bar still reaches its total


async def test_without_conversation_id_nothing_is_sent() -> None:
    fake = FakeRouter(first_token_delay=0.0, token_delay=0.0)
    w = build(WorkloadSpec(prefix_tokens=10, turns=1, conversations=1, user_tokens=3, output_tokens=2))
    async with serve(fake) as url, aiohttp.ClientSession() as s:
        await run(s, url, "m", w, send_conversation_id=False)
    assert "conversation_id" not in fake.bodies[0] and "X-Session-ID" not in fake.headers[0]


async def test_scraper_failure_reads_as_none() -> None:
    async with aiohttp.ClientSession() as s:
        scraper = EngineScraper(s, {"prefill": ["http://127.0.0.1:9"]})
        assert await scraper.role("prefill") is None
        assert await scraper.role("decode") is None


def test_parse_totals_sums_engines_and_ignores_other_metrics() -> None:
    text = (
        "# TYPE vllm:nixl_xfer_time_seconds histogram\n"
        'vllm:nixl_xfer_time_seconds_sum{engine="0"} 0.5\n'
        'vllm:nixl_xfer_time_seconds_sum{engine="1"} 0.25\n'
        'vllm:nixl_xfer_time_seconds_count{engine="0"} 3.0\n'
        "# TYPE vllm:nixl_post_time_seconds histogram\n"
        'vllm:nixl_post_time_seconds_sum{engine="0"} 9.0\n'
    )
    t = parse_totals(text)
    assert (t.seconds, t.count, t.bytes) == (0.75, 3.0, 0.0)


async def test_without_usage_tokens_are_counted_like_vllm_does() -> None:
    fake = FakeRouter(first_token_delay=0.0, token_delay=0.0, send_usage=False)
    w = build(WorkloadSpec(prefix_tokens=40, turns=2, conversations=1, user_tokens=6, tool_tokens=9, output_tokens=3))
    async with serve(fake) as url, aiohttp.ClientSession() as s:
        res = await run(s, url, "m", w)
    first, second = res.records
    assert first.input_num_tokens == 40 + 6  # message contents only, no template
    assert first.output_num_tokens == 3  # counted from the streamed text
    assert second.input_num_tokens == 40 + 6 + 3 + (9 + 6)
