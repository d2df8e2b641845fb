"""Short follow-up turns are prefilled on the decode that holds their conversation
(router.decodeLocalMaxTokens), between the fake engines: the routing, the fallback through
prefill, and the next turn's reuse."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from pdx_contract import holds as holds_contract
from pdx_contract import load as load_contract
from pdx_router.policy import local

from .conftest import Stack, StackFactory
from .helpers import LONG, assistant, chat, stream_text, user

Messages = list[dict[str, Any]]
LOCAL_ON = {"decode_local_max_tokens": 256}


async def turn(
    http: aiohttp.ClientSession, s: Stack, msgs: Messages, conversation: str | None = None, stream: bool = True
) -> tuple[str, dict[str, str], Messages]:
    """One turn: its outcome, its headers, and the history with its answer."""
    status, headers, data = await chat(http, s.url, msgs, conversation=conversation, stream=stream)
    assert status == 200, data
    text = stream_text(data) if stream else data["choices"][0]["message"]["content"]
    return headers["X-PDX-Reuse"], headers, [*msgs, assistant(text)]


def prefill_turns(s: Stack) -> int:
    return sum(1 for path, _ in s.prefill.requests if path != "/tokenize")


async def metrics(http: aiohttp.ClientSession, s: Stack) -> str:
    async with http.get(s.url + "/metrics") as r:
        return await r.text()


@pytest.mark.parametrize("conversation", [None, "c1"], ids=["by-history", "by-id"])
async def test_a_short_follow_up_is_prefilled_on_the_decode_that_holds_it(
    make_stack: StackFactory, http: aiohttp.ClientSession, conversation: str | None
) -> None:
    s = await make_stack(**LOCAL_ON)
    first, _, msgs = await turn(http, s, [user(LONG)], conversation)
    second, headers, _ = await turn(http, s, [*msgs, user("and then?")], conversation)
    assert (first, second) == ("miss", "local")
    assert prefill_turns(s) == 1  # only the first turn went through prefill
    assert headers["X-PDX-Prefill-Ms"] == "0.0"
    [done] = s.cluster.locals
    # decode's own prefix cache had the history: only its last partial block and the new
    # message were computed
    assert done.prompt_tokens - done.cached < 2 * s.cluster.block_size + 16
    assert not s.cluster.reads
    async with http.get(s.url + "/v1/pdx/stats") as r:
        assert (await r.json())["reuse"]["local"] == 1
    # the local turn's entry points at its decode: a drain of that decode waits for it
    async with http.get(s.url + "/v1/pdx/holding", params={"decode": s.decode_urls[0]}) as r:
        assert (await r.json())["entries"] == 1
    assert 'pdx_router_reuse_total{outcome="local"} 1.0' in await metrics(http, s)


async def test_the_turn_after_a_local_turn_reuses_again(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    s = await make_stack(**LOCAL_ON)
    outcomes = []
    msgs: Messages = [user(LONG)]
    for i in range(3):
        outcome, _, msgs = await turn(http, s, msgs, stream=i % 2 == 0)
        outcomes.append(outcome)
        msgs.append(user(f"step {i}"))
    long_outcome, _, _ = await turn(http, s, [*msgs, user(" ".join([LONG] * 4))])
    assert outcomes == ["miss", "local", "local"]
    assert long_outcome == "hit"  # too long for decode-local: prefill reads the local turn's KV
    assert len(s.cluster.reads) == 1 and s.cluster.reads[0].correct
    assert [lp.cached > 0 for lp in s.cluster.locals] == [True, True]
    assert 'pdx_router_decode_local_skipped_total{why="long"} 1.0' in await metrics(http, s)


async def test_engines_that_check_the_prefix_go_local_too(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    opts = {"checks_prefix": True, "kv_recompute_threshold": 8}
    s = await make_stack(prefill_opts=opts, decode_opts=opts, **LOCAL_ON)
    _, _, msgs = await turn(http, s, [user(LONG)])
    second, _, msgs = await turn(http, s, [*msgs, user("next")])
    third, _, _ = await turn(http, s, [*msgs, user("and next")], stream=False)
    assert (second, third) == ("local", "local")
    assert prefill_turns(s) == 1


async def test_off_by_default_every_turn_goes_through_prefill(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack()
    _, _, msgs = await turn(http, s, [user(LONG)])
    second, _, _ = await turn(http, s, [*msgs, user("next")])
    assert second == "hit" and not s.cluster.locals and prefill_turns(s) == 2


async def test_an_edited_history_under_an_id_goes_through_prefill(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    # Engines that check the prefix: the router plans a read without the prompt's ids, so
    # only the history's digests can tell which messages decode has
    opts = {"checks_prefix": True, "kv_recompute_threshold": 8}
    s = await make_stack(prefill_opts=opts, decode_opts=opts, **LOCAL_ON)
    _, _, msgs = await turn(http, s, [user(LONG)], "c1")
    msgs[0] = user("an earlier message, edited " + LONG)
    outcome, _, _ = await turn(http, s, [*msgs, user("next")], "c1")
    assert outcome == "prefix_mismatch" and not s.cluster.locals  # prefill's check read nothing
    assert 'pdx_router_decode_local_skipped_total{why="unknown"} 1.0' in await metrics(http, s)


async def stream_elsewhere(http: aiohttp.ClientSession, s: Stack) -> asyncio.Task[Any]:
    """Another conversation streaming from the one decode, 0.2 s into its answer."""
    other = asyncio.create_task(chat(http, s.url, [user("a long answer elsewhere")], conversation="c2", stream=True))
    await asyncio.sleep(0.2)
    return other


async def test_a_busy_decode_sends_the_turn_through_prefill(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(decode_opts={"token_delay": 0.05, "output_tokens": 20}, decode_local_max_busy=1, **LOCAL_ON)
    _, _, msgs = await turn(http, s, [user(LONG)], "c1")
    other = await stream_elsewhere(http, s)
    outcome, _, _ = await turn(http, s, [*msgs, user("next")], "c1")
    assert (await other)[0] == 200
    assert outcome == "hit"
    assert 'pdx_router_decode_local_skipped_total{why="busy"} 1.0' in await metrics(http, s)


TOOL_OUTPUT = " ".join(["result"] * 600)  # above decodeLocalMaxTokens (256), below the idle bound (4096)


async def idle_bound_stack(make_stack: StackFactory) -> Stack:
    return await make_stack(
        decode_opts={"token_delay": 0.05, "output_tokens": 20}, decode_local_idle_max_tokens=4096, **LOCAL_ON
    )


async def test_a_long_suffix_goes_local_on_an_idle_decode_and_through_prefill_beside_a_stream(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await idle_bound_stack(make_stack)
    _, _, msgs = await turn(http, s, [user(LONG)], "c1")
    idle, _, msgs = await turn(http, s, [*msgs, user(TOOL_OUTPUT)], "c1")
    other = await stream_elsewhere(http, s)
    beside, _, _ = await turn(http, s, [*msgs, user(TOOL_OUTPUT)], "c1")
    assert (await other)[0] == 200
    assert (idle, beside) == ("local", "hit")
    assert 'pdx_router_decode_local_skipped_total{why="long"} 1.0' in await metrics(http, s)


async def test_a_health_check_that_finds_the_routers_own_turn_decoding_leaves_the_decode_idle_after_it(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await idle_bound_stack(make_stack)
    _, _, msgs = await turn(http, s, [user(LONG)], "c1")
    other = await stream_elsewhere(http, s)  # the engine counts it running
    await s.router.discovery.check_all()
    assert (await other)[0] == 200
    outcome, _, _ = await turn(http, s, [*msgs, user(TOOL_OUTPUT)], "c1")
    assert outcome == "local"


async def test_a_long_suffix_looks_again_at_a_decode_a_stale_scrape_found_busy_with_someone_elses_request(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    """A request sent straight to decode (another replica's, a benchmark's bound) that the last
    health check saw keeps a long suffix off decode only while it still runs."""
    s = await idle_bound_stack(make_stack)
    _, _, msgs = await turn(http, s, [user(LONG)], "c1")
    direct = asyncio.create_task(chat(http, s.decode_urls[0], [user("not the router's")], conversation=None))
    await asyncio.sleep(0.2)
    await s.router.discovery.check_all()  # finds it running: not this router's
    decode = next(ep for ep in s.router.pool.endpoints if ep.role == "decode")
    assert s.decode.running == 1 and decode.others_load == 1
    await asyncio.sleep(local.FRESH_S)  # the scrape is no longer fresh, and the request still runs
    beside, _, msgs = await turn(http, s, [*msgs, user(TOOL_OUTPUT)], "c1")
    assert (await direct)[0] == 200 and s.decode.running == 0 and decode.others_load == 1
    await asyncio.sleep(local.FRESH_S)  # past the look the last turn took
    after, _, _ = await turn(http, s, [*msgs, user(TOOL_OUTPUT)], "c1")  # the health check's scrape still says 1
    assert (beside, after) == ("hit", "local")


async def test_a_decode_with_pdx_s_load_route_is_asked_its_load_there_not_in_its_metrics(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    """The fresh look of the test above, against a decode that answers GET /v1/pdx/load: its
    /metrics (vLLM renders every metric for it) is read once, for the block size."""
    s = await make_stack(
        decode_opts={"token_delay": 0.05, "output_tokens": 20, "load_route": True},
        decode_local_idle_max_tokens=4096,
        **LOCAL_ON,
    )
    _, _, msgs = await turn(http, s, [user(LONG)], "c1")
    direct = asyncio.create_task(chat(http, s.decode_urls[0], [user("not the router's")], conversation=None))
    await asyncio.sleep(0.2)
    await s.router.discovery.check_all()
    decode = next(ep for ep in s.router.pool.endpoints if ep.role == "decode")
    assert decode.load_route is True and decode.others_load == 1
    await asyncio.sleep(local.FRESH_S)
    looks = s.decode.asked[load_contract.PATH]
    beside, _, msgs = await turn(http, s, [*msgs, user(TOOL_OUTPUT)], "c1")
    assert (await direct)[0] == 200 and s.decode.asked[load_contract.PATH] == looks + 1  # the fresh look
    assert beside == "hit" and s.decode.asked["/metrics"] == 1


async def test_a_decode_without_the_load_route_is_read_from_its_metrics_from_then_on(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await idle_bound_stack(make_stack)  # the fake's route is off: 404, as a vLLM without pdx's plugin
    await turn(http, s, [user(LONG)], "c1")
    decode = next(ep for ep in s.router.pool.endpoints if ep.role == "decode")
    metrics_before = s.decode.asked["/metrics"]
    await s.router.discovery.check_all()
    await s.router.discovery.check_all()
    assert decode.load_route is False and decode.others_load == 0
    assert s.decode.asked["/metrics"] == metrics_before + 2


async def test_a_local_turn_the_decode_fails_goes_through_prefill_once(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(decode_opts={"fail_local": True}, **LOCAL_ON)
    _, _, msgs = await turn(http, s, [user(LONG)])
    status, headers, lines = await chat(http, s.url, [*msgs, user("next")], conversation=None, stream=True)
    assert status == 200 and headers["X-PDX-Reuse"] == "hit"  # read back by prefill instead
    assert sum(1 for ln in lines if ln == b"data: [DONE]") == 1  # one answer, not two
    assert prefill_turns(s) == 2 and s.cluster.reads[0].correct


async def test_a_local_turn_whose_decode_is_gone_runs_plainly_on_another(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(n_decode=2, **LOCAL_ON)
    _, _, msgs = await turn(http, s, [user(LONG)])
    holder = next(i for i, d in enumerate(s.decodes) if any(p != "/tokenize" for p, _ in d.requests))
    await s.runners[1 + holder].cleanup()  # the decode that holds the conversation goes away
    outcome, _, _ = await turn(http, s, [*msgs, user("next")])
    assert outcome == "expired" and not s.cluster.reads


async def valve_stack(make_stack: StackFactory) -> Stack:
    """Decode-local on, over engines that check the prefix and run pdx's held-KV valve."""
    opts = {"checks_prefix": True, "valve": True}
    return await make_stack(prefill_opts=opts, decode_opts=opts, **LOCAL_ON)


async def test_a_hold_its_decode_said_it_released_goes_through_prefill_not_local(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await valve_stack(make_stack)
    _, _, a = await turn(http, s, [user("a " + LONG)], "a")
    _, _, b = await turn(http, s, [user("b " + LONG)], "b")
    rid_a = next(rid for (_, rid) in s.cluster.held)
    assert s.decodes[0].release(rid_a)  # pressure on decode: a's blocks went to other work
    second_b, _, _ = await turn(http, s, [*b, user("and then?")], "b")  # its answer names a's release
    assert second_b == "local"
    second_a, _, _ = await turn(http, s, [*a, user("and then?")], "a")
    # decode no longer holds a's history: prefill computes it and decode reads it, instead of
    # decode computing the whole history in its own batch
    assert second_a == "released"
    assert [lp.cached > 0 for lp in s.cluster.locals] == [True]  # b's local turn only
    assert prefill_turns(s) == 3
    assert 'pdx_router_decode_local_skipped_total{why="released"} 1.0' in await metrics(http, s)


def claims_made(s: Stack) -> list[list[str]]:
    """The holds each claim on the decode named (its health checks' polls name none)."""
    return [body["claim"] for path, body in s.decode.requests if path == holds_contract.PATH and body["claim"]]


async def test_a_local_turn_on_a_pressed_decode_claims_its_hold_and_goes_released_if_decode_gave_it_up(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    """What the router last heard can be stale under pressure: decode may have given the hold's
    blocks to other work since, and a local turn would then compute the whole history again in
    decode's batch. The claim's answer is current."""
    s = await valve_stack(make_stack)
    _, _, a = await turn(http, s, [user("a " + LONG)], "a")
    await turn(http, s, [user("b " + LONG)], "b")
    _, _, c = await turn(http, s, [user("c " + LONG)], "c")
    rid_a, rid_b, _ = (rid for (_, rid) in s.cluster.held)
    assert s.decodes[0].release(rid_b)  # pressure the router hears of with c's next answer
    second_c, _, _ = await turn(http, s, [*c, user("and then?")], "c")
    assert second_c == "local"  # c's hold was not claimed: the decode was not pressed yet
    assert claims_made(s) == []
    assert s.decodes[0].release(rid_a)  # pressure again, unheard of: no answer names it yet
    second_a, _, _ = await turn(http, s, [*a, user("and then?")], "a")
    assert claims_made(s) == [[rid_a]]
    assert second_a == "released"  # through prefill: decode is not asked to compute a's history
    assert [lp.cached > 0 for lp in s.cluster.locals] == [True]  # c's local turn only
    assert 'pdx_router_decode_local_skipped_total{why="released"} 1.0' in await metrics(http, s)


async def test_a_local_turn_on_a_pressed_decode_keeps_its_hold_claimed_until_the_turn_ends(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await valve_stack(make_stack)
    _, _, a = await turn(http, s, [user("a " + LONG)], "a")
    await turn(http, s, [user("b " + LONG)], "b")
    rid_a, rid_b = (rid for (_, rid) in s.cluster.held)
    assert s.decodes[0].release(rid_b)
    await s.router.discovery.check_all()  # its holds poll names the release: pressed
    second_a, _, _ = await turn(http, s, [*a, user("and then?")], "a")
    assert second_a == "local" and claims_made(s) == [[rid_a]]
    assert s.cluster.claims[("decode-0", rid_a)] == 1  # pinned through the turn; the drop goes after it
    await asyncio.sleep(1.5)  # the drop's flush (claims.FLUSH_SECONDS)
    assert s.cluster.claims[("decode-0", rid_a)] == 0
    assert [lp.cached > 0 for lp in s.cluster.locals] == [True]
