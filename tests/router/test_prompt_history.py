"""The prompt digests and head indexes that find a completions turn without an id
(policy/prompt_history.py, and the stores' indexes)."""

from __future__ import annotations

import contextlib
import time
import tracemalloc
from collections.abc import AsyncIterator, Coroutine
from dataclasses import replace
from typing import Any

import orjson
import pytest

from pdx_router import ids
from pdx_router.answer import StreamedText
from pdx_router.entries import Entry
from pdx_router.policy import history, prompt_history, shapes
from pdx_router.policy.prompt_history import CHECKPOINTS, MAX_KEYS, Prompt, of_ids, of_text
from pdx_router.store import HEAD_ENTRIES, INDEX_ENTRY_BYTES, MemoryStore, RedisStore, Store

from .helpers import entry

T, S = "a" * 32, "b" * 32
PROMPT = "You are terse.\n" + " ".join(f"word{i}" for i in range(300)) + "\n"


def found(p: Prompt, *turns: prompt_history.Turn) -> list[int]:
    """The lengths of the stored turns this prompt's lookup names, in the order it tries them
    (a store that holds just `turns`, under their heads)."""
    lengths = [t.length for h in p.heads for t in turns if t.head == h]
    stored = {t.digest: t.length for t in turns}
    return [stored[d] for _, d in p.candidates(lengths) if d in stored]


def text_turn(prompt: str, said: str) -> prompt_history.Turn:
    done = of_text(prompt, T, S).turn({"text": said}, None)
    assert done is not None
    return done


def test_a_prompt_that_continues_a_text_turn_names_it() -> None:
    stored = text_turn(PROMPT, " The answer.")
    assert found(of_text(PROMPT + " The answer.\nAnd more?", T, S), stored) == [stored.length]


def test_an_answer_sent_back_without_its_trailing_whitespace_still_names_the_turn() -> None:
    stored = text_turn(PROMPT, " The answer. \n")
    assert found(of_text(PROMPT + " The answer.More", T, S), stored) == [stored.length]
    assert found(of_text(PROMPT + " The answer. \nMore", T, S), stored) == [stored.length]


def test_an_edit_anywhere_before_the_turns_end_names_nothing() -> None:
    stored = text_turn(PROMPT, " The answer.")
    assert found(of_text("X" + PROMPT[1:] + " The answer. More", T, S), stored) == []
    assert found(of_text(PROMPT + " The answeR. More", T, S), stored) == []


def test_the_longest_stored_turn_is_tried_first() -> None:
    first = text_turn(PROMPT, " one")
    second = text_turn(PROMPT + " one two ", " three")
    assert found(of_text(PROMPT + " one two  three four", T, S), first, second) == [second.length, first.length]


def test_a_short_prompt_and_a_long_one_both_name_their_turns() -> None:
    short = text_turn("hi", " there")
    assert found(of_text("hi there, you", T, S), short) == [short.length]
    long = text_turn(PROMPT * 300, " end")  # 800 kB
    assert found(of_text(PROMPT * 300 + " end.", T, S), long) == [long.length]


def test_an_ids_turn_is_the_prompt_and_the_generated_ids_but_the_last() -> None:
    done = of_ids(ids.of_list([5, 6, 7]), T, S).turn(None, [8, 9, 2])
    assert done is not None
    for sent_back in ([5, 6, 7, 8, 9, 2, 11], [5, 6, 7, 8, 9, 11]):  # EOS sent back, or dropped
        assert found(of_ids(ids.of_list(sent_back), T, S), done) == [done.length]


def test_an_ids_prefix_ends_between_ids() -> None:
    done = of_ids(ids.of_list([1, 2, 3]), T, S).turn(None, [4, 5])  # holds 1,2,3,4
    assert done is not None
    assert found(of_ids(ids.of_list([1, 2, 3, 45, 6]), T, S), done) == []
    assert found(of_ids(ids.of_list([1, 2, 3, 4, 6]), T, S), done) == [done.length]


def test_text_and_ids_never_name_each_others_turns() -> None:
    done = of_ids(ids.of_list([1, 2]), T, S).turn(None, [3, 4])  # "1,2,3,"
    assert done is not None
    assert found(of_text("1,2,3,4", T, S), done) == []


def test_without_the_completion_nothing_is_named() -> None:
    assert of_text("p", T, S).turn(None, None) is None
    assert of_ids(ids.of_list([1]), T, S).turn(None, []) is None


def test_a_batch_an_empty_prompt_and_an_echo_have_no_prompt_history() -> None:
    assert prompt_history.of_body({"prompt": ["a", "b"]}, T, S) is None
    assert prompt_history.of_body({"prompt": [[1, 2], [3]]}, T, S) is None
    assert prompt_history.of_body({"prompt": ""}, T, S) is None
    assert prompt_history.of_body({"prompt": "x", "echo": True}, T, S) is None
    assert prompt_history.of_body({"prompt": [1, -2]}, T, S) is None
    assert prompt_history.of_body({"prompt": [1, 2]}, T, S) is not None


def test_a_lookup_reads_a_few_heads_per_doubling_and_tries_a_bounded_number_of_keys() -> None:
    big = of_text("x" * 100_000, T, S)
    assert len(big.heads) == len([c for c in CHECKPOINTS if c <= 100_000]) < 40
    assert len(big.candidates(range(1, 100_001))) == MAX_KEYS
    assert len(of_text("x" * (16 << 20), T, S).heads) < 80  # the largest request the router reads


def test_a_turns_head_holds_all_but_its_last_sixth() -> None:
    for n in (300, 1000, 5000, 123_456):
        assert n / 2**0.25 - 1 <= prompt_history.checkpoint(n) <= n


def test_keys_are_bound_to_tenant_and_scope_and_no_id_or_chat_history_names_one() -> None:
    def key(tenant: str, scope: str) -> str:
        done = of_text("p", tenant, scope).turn({"text": "q"}, None)
        assert done is not None
        return done.key

    k = key(T, S)
    assert k not in (key("c" * 32, S), key(T, "c" * 32))
    assert len(k) == 33 and len(history.key(T, S, b"d")) == len(shapes.entry_key(T, "c", S)) == 64
    p = of_text(PROMPT, T, S)
    assert not set(p.head_keys()) & set(p.keys(range(1, len(PROMPT) + 1)))


def test_a_streamed_completions_text_reads_the_same_compact_or_not() -> None:
    def event(text: str) -> bytes:
        return b"data: " + orjson.dumps({"id": "c", "choices": [{"index": 0, "text": text, "finish_reason": None}]})

    plain = [" plain", " \u00fc 中文", "", " end \n"]
    odd = [' a "quoted"', ' "text": x', "back\\slash"]
    spaced = b'data: {"choices": [{"index": 0, "text" : " spaced"}]}'
    for texts, lines in (
        (plain, [event(t) for t in plain]),
        ([*plain, *odd, " spaced"], [*map(event, [*plain, *odd]), spaced]),
    ):
        said = StreamedText()
        for line in [*lines, b"data: [DONE]"]:
            said.feed(line + b"\n\n")
        assert said.message() == {"text": "".join(texts)}


def test_an_unreadable_streamed_completions_line_leaves_the_text_unknown() -> None:
    said = StreamedText()
    said.feed(b'data: {"choices": [{"index": 0, "text": "x"\n\n')
    assert said.message() is None


# ---------------------------------------------------------------- the stores' indexes


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield MemoryStore(1000)
        return
    url = request.getfixturevalue("redis_url")
    prefix = f"pdx-test-prompt-{request.node.name}:"
    redis = RedisStore(url, prefix, max_entries=1000)
    yield redis
    await redis.close()


def _entry(tenant: str = "t", deadline: float | None = None) -> Entry:
    return replace(entry(list(range(100)), 25, deadline=deadline or time.time() + 60), tenant=tenant)


async def test_a_heads_index_lists_its_most_recent_entries_and_drops_the_older(store: Store) -> None:
    for i in range(3 * HEAD_ENTRIES):
        await store.put(f"k{i}", _entry(), "head", 1000 + i)
    assert sorted(await store.lengths(["head"])) == [1000 + i for i in range(2 * HEAD_ENTRIES, 3 * HEAD_ENTRIES)]
    assert await store.count() == HEAD_ENTRIES  # the older ones no lookup could find
    assert await store.take("k0") is None and await store.take(f"k{3 * HEAD_ENTRIES - 1}") is not None


async def test_an_entry_taken_or_replaced_leaves_its_heads_index(store: Store) -> None:
    await store.put("a", _entry(), "head", 10)
    await store.put("b", _entry(), "head", 20)
    assert await store.take_first(["x", "a"]) is not None
    assert await store.lengths(["head", "other"]) == [20]
    await store.put("b", _entry(), "other", 30)
    assert await store.lengths(["head"]) == [] and await store.lengths(["other"]) == [30]
    await store.put("b", _entry())
    assert await store.lengths(["head", "other"]) == [] and await store.count() == 1


async def test_a_tenants_entries_never_crowd_another_tenants_index() -> None:
    """Heads are bound to the tenant: another's flood under the same prompt lists elsewhere."""
    store = MemoryStore(1000)
    (mine,), (theirs,) = of_text(PROMPT, T, S).head_keys()[-1:], of_text(PROMPT, "c" * 32, S).head_keys()[-1:]
    await store.put("mine", _entry(T), mine, 500)
    for i in range(4 * HEAD_ENTRIES):
        await store.put(f"theirs{i}", _entry("c" * 32), theirs, 600 + i)
    assert await store.lengths([mine]) == [500] and await store.take("mine") is not None


async def test_the_index_counts_in_the_bytes_of_the_store_and_its_tenant() -> None:
    plain, listed = MemoryStore(1000), MemoryStore(1000)
    await plain.put("k", _entry())
    await listed.put("k", _entry(), "h" * 64, 1234)
    assert await listed.nbytes() == await plain.nbytes() + INDEX_ENTRY_BYTES


def _now(call: Coroutine[Any, Any, Any]) -> None:
    """Run a memory store's call, which never waits, without an event loop (whose own
    allocations would blur tracemalloc's count)."""
    with contextlib.suppress(StopIteration):
        call.send(None)


@pytest.mark.parametrize("heads", [800, 100])
def test_the_memory_index_costs_no_more_than_it_counts(heads: int) -> None:
    """tracemalloc: a store whose entries are listed under `heads` heads, less one whose
    entries are not, is within INDEX_ENTRY_BYTES an entry."""
    n = 800
    entries = [_entry() for _ in range(n)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        bare = MemoryStore(10_000)
        for i, e in enumerate(entries):
            _now(bare.put(f"{i:064x}", e))
        middle = tracemalloc.get_traced_memory()[0]
        listed = MemoryStore(10_000)
        for i, e in enumerate(entries):
            _now(listed.put(f"{i:064x}", e, f"{i % heads:064x}", 1000 + i))
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    per_entry = ((after - middle) - (middle - before)) / n
    assert 0 < per_entry <= INDEX_ENTRY_BYTES, per_entry


async def test_redis_lists_lengths_only_for_the_heads_asked(redis_url: str) -> None:
    store = RedisStore(redis_url, "pdx-test-prompt-heads:", max_entries=100)
    try:
        await store.put("a", _entry(), "h1", 7)
        await store.put("b", _entry(), "h2", 9)
        assert await store.lengths([]) == [] and sorted(await store.lengths(["h1", "h2", "h3"])) == [7, 9]
    finally:
        await store.close()
