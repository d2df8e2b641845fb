"""`/v1/completions` clients that send no conversation id reuse decode's KV: the router finds
the turn a prompt continues by its prefix (policy/prompt_history.py), between the fake engines."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from pdx_contract.router_config import TenancyConfig
from pdx_router.config import StoreConfig
from pdx_router.store import HEAD_ENTRIES

from .conftest import StackFactory
from .helpers import LONG

START = f"You are terse.\n{LONG}\n"  # ~550 bytes
CHECKS = {"checks_prefix": True, "kv_recompute_threshold": 8}


async def complete(
    http: aiohttp.ClientSession,
    url: str,
    prompt: str | list[int],
    stream: bool = False,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> tuple[str, dict[str, str], Any]:
    """One completions turn: the outcome, the headers, and the text (or the generated ids, for
    a prompt of ids)."""
    body: dict[str, Any] = {"model": "Qwen", "prompt": prompt, "stream": stream, **extra}
    if isinstance(prompt, list):
        body["return_token_ids"] = True
    async with http.post(url + "/v1/completions", json=body, headers=headers or {}) as r:
        raw = await r.read()
        assert r.status == 200, raw
        out = dict(r.headers)
    if stream:
        events = [orjson.loads(ln[6:]) for ln in raw.split(b"\n") if ln.startswith(b"data: {")]
        choices = [c for e in events for c in e["choices"]]
        text = "".join(c.get("text") or "" for c in choices)
        generated = [t for c in choices for t in c.get("token_ids") or ()]
    else:
        choice = orjson.loads(raw)["choices"][0]
        text, generated = choice["text"], choice.get("token_ids")
    return out["X-PDX-Reuse"], out, generated if isinstance(prompt, list) else text


async def test_a_text_prompt_loop_without_an_id_hits_on_turns_2_and_3(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack()
    prompt, outcomes = START, []
    for i in range(3):
        outcome, headers, text = await complete(http, s.url, prompt, stream=i != 1)
        outcomes.append((outcome, headers["X-PDX-Found-By"]))
        prompt += f"{text}\nand then {i}\n"
    assert outcomes == [("miss", "history"), ("hit", "history"), ("hit", "history")]
    assert len(s.cluster.reads) == 2 and all(r.correct for r in s.cluster.reads)
    stats = await (await http.get(s.url + "/v1/pdx/stats")).json()
    assert stats["foundBy"]["history"] == 2


async def test_a_token_id_prompt_loop_without_an_id_hits_on_turns_2_and_3(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack()
    prompt, outcomes = list(range(300, 420)), []
    for i in range(3):
        outcome, _, generated = await complete(http, s.url, prompt, stream=i == 1)
        outcomes.append(outcome)
        prompt += [*generated, 500 + i, 600 + i]
    assert outcomes == ["miss", "hit", "hit"]
    assert len(s.cluster.reads) == 2 and all(r.correct for r in s.cluster.reads)
    assert not any(p == "/tokenize" for p, _ in s.prefill.requests)  # the router compared the ids itself


async def test_a_prompt_that_edits_its_start_misses(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    s = await make_stack()
    _, _, text = await complete(http, s.url, START)
    outcome, _, _ = await complete(http, s.url, "Be verbose." + START[len("You are terse.") :] + text + "\nmore\n")
    assert outcome == "miss" and not s.cluster.reads


async def test_no_tenant_matches_another_tenants_prompt(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    s = await make_stack(tenancy=TenancyConfig(identity="apiKey"))
    a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    _, _, text = await complete(http, s.url, START, headers=a)
    probe, _, _ = await complete(http, s.url, f"{START}{text}\nguess\n", headers=b)
    assert probe == "miss" and not s.cluster.reads
    # the probe consumed nothing, and its own turn listed under its own tenant's heads
    owner, _, _ = await complete(http, s.url, f"{START}{text}\nmine\n", headers=a)
    assert owner == "hit" and len(s.cluster.reads) == 1 and s.cluster.reads[0].correct


async def test_a_fork_reuses_once_and_keeps_both_branches(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack()
    _, _, text = await complete(http, s.url, START)
    base = f"{START}{text}\n"
    first, _, a = await complete(http, s.url, base + "branch a\n")
    second, _, b = await complete(http, s.url, base + "branch b\n")  # as long as branch a
    assert (first, second) == ("hit", "miss")  # decode freed the blocks once read: plain P/D
    next_a, _, _ = await complete(http, s.url, f"{base}branch a\n{a}\nmore a\n")
    next_b, _, _ = await complete(http, s.url, f"{base}branch b\n{b}\nmore b\n")
    assert (next_a, next_b) == ("hit", "hit")
    assert len(s.cluster.reads) == 3 and all(r.correct for r in s.cluster.reads)


async def test_many_conversations_sharing_a_head_keep_only_its_most_recent_turns(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    """Prompts that differ only past their turns' head share one index: it stays bounded, and
    the most recent conversations still reuse."""
    s = await make_stack()
    shared = START * 6  # ~3.3 kB: every turn below stays under the next checkpoint
    texts = [(await complete(http, s.url, f"{shared}q{i}\n"))[2] for i in range(3 * HEAD_ENTRIES)]
    stats = await (await http.get(s.url + "/v1/pdx/stats")).json()
    assert stats["entries"] == HEAD_ENTRIES
    last = 3 * HEAD_ENTRIES - 1
    newest, _, _ = await complete(http, s.url, f"{shared}q{last}\n{texts[last]}\nmore\n")
    oldest, _, _ = await complete(http, s.url, f"{shared}q0\n{texts[0]}\nmore\n")
    assert (newest, oldest) == ("hit", "miss")


async def test_with_ids_only_a_prompt_finds_nothing(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    s = await make_stack(conversation_from="id")
    _, _, text = await complete(http, s.url, START)
    outcome, headers, _ = await complete(http, s.url, f"{START}{text}\nmore\n")
    assert (outcome, headers["X-PDX-Found-By"]) == ("none", "none")


async def test_an_id_still_wins_over_a_prompt(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    s = await make_stack()
    _, _, text = await complete(http, s.url, START, conversation_id="c9")
    outcome, headers, _ = await complete(http, s.url, f"{START}{text}\nmore\n", conversation_id="c9")
    assert (outcome, headers["X-PDX-Found-By"]) == ("hit", "id")
    # kept by its id only: no prompt lookup finds it
    outcome, _, _ = await complete(http, s.url, f"{START}{text}\nmore\n")
    assert outcome == "miss"


async def test_engines_that_check_the_prefix_reuse_text_and_id_prompts(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    """A decode that names what it holds is still asked for the generated ids of a prompt of
    ids (they name the turn kept), not for a text prompt's."""
    s = await make_stack(prefill_opts=CHECKS, decode_opts=CHECKS)
    prompt: str = START
    ids: list[int] = list(range(300, 420))
    outcomes = []
    for i in range(3):
        outcome, _, text = await complete(http, s.url, prompt, stream=i == 1)
        prompt += f"{text}\nand then {i}\n"
        by_ids, _, generated = await complete(http, s.url, ids, stream=i == 2)
        ids += [*generated, 500 + i]
        outcomes.append((outcome, by_ids))
    assert outcomes == [("miss", "miss"), ("hit", "hit"), ("hit", "hit")]
    assert all(r.correct for r in s.cluster.reads) and len(s.cluster.reads) == 4
    asked = [bool(b.get("return_token_ids")) for _, b in s.decode.requests]
    assert asked == [True, True, False, True, False, True]


@pytest.mark.redis
async def test_router_replicas_share_prompt_histories_through_redis(
    make_stack: StackFactory, http: aiohttp.ClientSession, redis_url: str
) -> None:
    s = await make_stack(routers=2, store=StoreConfig(kind="redis", url=redis_url, key_prefix="pdx-test-prompt-r:"))
    _, _, text = await complete(http, s.router_urls[0], START, stream=True)
    base = f"{START}{text}\n"
    first, _, a = await complete(http, s.router_urls[1], base + "on the other router\n", stream=True)
    fork, _, _ = await complete(http, s.router_urls[0], base + "a fork\n")
    assert (first, fork) == ("hit", "miss")
    third, _, _ = await complete(http, s.router_urls[0], f"{base}on the other router\n{a}\nback again\n")
    assert third == "hit" and len(s.cluster.reads) == 2 and all(r.correct for r in s.cluster.reads)


@pytest.mark.parametrize("kind", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def test_prompt_turns_and_their_index_count_in_one_tenants_share(
    make_stack: StackFactory, http: aiohttp.ClientSession, request: pytest.FixtureRequest, kind: str
) -> None:
    """A tenant flooding the router with completions without ids drops only its own turns."""
    share = 15_000  # a stored turn here: ~2.5 kB with its index
    store = StoreConfig(max_bytes=30_000, max_bytes_per_tenant=share)
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
        store = StoreConfig(
            kind="redis", url=url, key_prefix="pdx-test-prompt-b:", max_bytes=30_000, max_bytes_per_tenant=share
        )
    s = await make_stack(store=store, tenancy=TenancyConfig(identity="apiKey"))
    alice, mallory = {"Authorization": "Bearer alice"}, {"Authorization": "Bearer mallory"}
    _, _, text = await complete(http, s.url, START, headers=alice)
    for i in range(40):
        await complete(http, s.url, f"{i} {START}", headers=mallory)
    stats = await (await http.get(s.url + "/v1/pdx/stats")).json()
    assert 0 < stats["storeBytes"] <= share + 4000 and stats["entries"] < 40
    outcome, _, _ = await complete(http, s.url, f"{START}{text}\nnext\n", headers=alice)
    assert outcome == "hit"
