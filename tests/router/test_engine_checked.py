"""Engines that check the prefix themselves (the pdx plugin): the router reuses without ids."""

from __future__ import annotations

import aiohttp

from pdx_contract import kv_prefix

from .conftest import StackFactory
from .helpers import LONG, assistant, chat, user

CHECKS = {"checks_prefix": True, "kv_recompute_threshold": 8}


async def test_a_growing_conversation_reuses_with_no_tokenize_call_and_no_ids_asked(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(prefill_opts=CHECKS, decode_opts=CHECKS)
    msgs = [user(LONG)]
    for turn in range(3):
        status, headers, data = await chat(http, s.url, msgs, stream=turn == 2)
        assert status == 200
        assert headers["X-PDX-Reuse"] == ("miss" if turn == 0 else "hit")
        text = "".join(x.decode() for x in data) if turn == 2 else data["choices"][0]["message"]["content"]
        msgs += [assistant(text[:40]), user(f"step {turn}")]
    assert [r.correct for r in s.cluster.reads] == [True, True]
    assert int(headers["X-PDX-Reused-Tokens"]) > 80
    paths = [p for p, _ in s.prefill.requests]
    assert "/tokenize" not in paths and paths == ["/v1/chat/completions"] * 3
    # The first turn asks decode for ids (nothing is known of it yet); once its answer named
    # what it holds, no more.
    asked = [bool(b.get("return_token_ids")) for _, b in s.decode.requests]
    assert asked == [True, False, False]
    stats = await (await http.get(s.url + "/v1/pdx/stats")).json()
    assert stats["reuse"]["hit"] == 2 and stats["reusedTokens"] > 160
    assert sum(stats["promptIds"].values()) == 0


async def test_an_edited_history_reads_only_the_blocks_prefill_found_unchanged(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(prefill_opts=CHECKS, decode_opts=CHECKS)
    first = [user(LONG)]
    _, _, data = await chat(http, s.url, first)
    words = LONG.split()
    words[60] = "edited"
    status, headers, _ = await chat(
        http, s.url, [user(" ".join(words)), assistant(data["choices"][0]["message"]["content"]), user("next")]
    )
    assert status == 200 and headers["X-PDX-Reuse"] == "hit"
    reused = int(headers["X-PDX-Reused-Tokens"])
    assert 8 <= reused <= 64 and reused % 16 == 0  # whole blocks before the edited word
    assert [r.correct for r in s.cluster.reads] == [True]
    assert s.cluster.reads[0].tokens == reused


async def test_a_new_history_reads_nothing_and_is_a_prefix_mismatch(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(prefill_opts=CHECKS, decode_opts=CHECKS)
    await chat(http, s.url, [user(LONG)])
    status, headers, _ = await chat(http, s.url, [user("something else " + LONG)])
    assert status == 200 and headers["X-PDX-Reuse"] == "prefix_mismatch"
    assert headers["X-PDX-Reused-Tokens"] == "0"
    assert all(r.tokens == 0 for r in s.cluster.reads)


async def test_a_prefill_without_the_check_reads_none_of_what_decode_hides(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(decode_opts=CHECKS)  # decode with the plugin, prefill without
    msgs = [user(LONG)]
    _, _, data = await chat(http, s.url, msgs)
    msgs += [assistant(data["choices"][0]["message"]["content"]), user("and then?")]
    status, headers, _ = await chat(http, s.url, msgs)
    assert status == 200 and headers["X-PDX-Reuse"] == "prefix_mismatch"
    sent = s.prefill.requests[-1][1]["kv_transfer_params"]
    assert sent["remote_num_tokens"] == 0 and kv_prefix.HELD in sent
    assert all(r.tokens == 0 for r in s.cluster.reads)


async def test_the_client_sees_none_of_the_plugins_fields(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(prefill_opts=CHECKS, decode_opts=CHECKS)
    msgs = [user(LONG)]
    _, _, data = await chat(http, s.url, msgs)
    msgs += [assistant(data["choices"][0]["message"]["content"]), user("and then?")]
    for stream in (False, True):
        status, _, answer = await chat(http, s.url, msgs, stream=stream)
        raw = b"".join(answer) if stream else repr(answer).encode()
        assert status == 200
        assert b"pdx_" not in raw and b"kv_transfer_params" not in raw and b"token_ids" not in raw
