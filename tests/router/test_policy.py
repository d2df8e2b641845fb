"""Pure decisions: engine choice, generation pairing, reuse and how many tokens."""

from __future__ import annotations

from pdx_router.chat_tokens import renders_plainly
from pdx_router.endpoints import Endpoint
from pdx_router.entries import Entry
from pdx_router.policy import (
    FRESH_PREFILL_KV,
    Outcome,
    check_entry,
    choose_decode,
    choose_generation,
    choose_prefill,
    clean_client_body,
    cut_block_ids,
    decode_body,
    make_entry,
    pin_completion_prompt,
    plan_reuse,
    prefill_body,
    prefill_on_ids,
    prefill_request,
    prompt_ids_agree,
    tokenize_body,
)
from pdx_router.tokens import common_prefix_len, infer_block_size


def ep(role: str, url: str, gen: str = "g1", healthy: bool = True, load: int = 0) -> Endpoint:
    return Endpoint(url=url, role=role, generation=gen, healthy=healthy, outstanding=load)  # type: ignore[arg-type]


def entry(tokens: list[int], blocks: int, block_size: int | None = 4, deadline: float = 100.0) -> Entry:
    kv = {
        "do_remote_prefill": False,
        "do_remote_decode": True,
        "remote_block_ids": [list(range(10, 10 + blocks))],
        "remote_engine_id": "decode-0",
        "remote_request_id": "r",
        "remote_host": "10.0.0.2",
        "remote_port": 5700,
        "remote_num_tokens": len(tokens),
        "remote_blocks_expiry_time": 9.0,
    }
    return Entry(kv, tokens, "http://d0", "g1", 0.0, deadline, block_size)


def test_configured_generation_preferred_when_it_has_a_pair() -> None:
    eps = [ep("prefill", "p1", "old"), ep("decode", "d1", "old"), ep("prefill", "p2", "new"), ep("decode", "d2", "new")]
    assert choose_generation(eps, "new") == "new"


def test_generation_with_most_pairs_when_configured_has_none() -> None:
    eps = [
        ep("prefill", "p1", "old"),
        ep("prefill", "p2", "old"),
        ep("decode", "d1", "old"),
        ep("decode", "d2", "old"),
        ep("prefill", "p3", "mid"),
        ep("decode", "d3", "mid"),
        ep("prefill", "p4", "new"),
        ep("decode", "d4", "new", healthy=False),
    ]
    assert choose_generation(eps, "new") == "old"


def test_no_generation_without_a_healthy_pair() -> None:
    eps = [ep("prefill", "p1", "a"), ep("decode", "d1", "b")]
    assert choose_generation(eps, "a") is None


def test_prefill_and_decode_never_cross_generations() -> None:
    eps = [
        ep("prefill", "p-old", "old"),
        ep("decode", "d-old", "old"),
        ep("prefill", "p-new", "new"),
        ep("decode", "d-new", "new"),
    ]
    assert choose_prefill(eps, "new").url == "p-new"  # type: ignore[union-attr]
    assert choose_decode(eps, "new", affinity_url="d-old").url == "d-new"  # type: ignore[union-attr]


def test_least_outstanding_wins() -> None:
    eps = [ep("prefill", "p1", load=3), ep("prefill", "p2", load=1), ep("prefill", "p3", load=2)]
    assert choose_prefill(eps, "g1").url == "p2"  # type: ignore[union-attr]


def test_decode_affinity_only_when_healthy() -> None:
    eps = [ep("decode", "d1", load=0), ep("decode", "d2", load=9)]
    assert choose_decode(eps, "g1", "d2").url == "d2"  # type: ignore[union-attr]
    eps[1].healthy = False
    assert choose_decode(eps, "g1", "d2").url == "d1"  # type: ignore[union-attr]


def test_exact_extension_reuses_everything_decode_holds() -> None:
    held = list(range(100, 140))
    plan = plan_reuse(entry(held, 10), [*held, 7, 8, 9], threshold=8)
    assert plan.outcome is Outcome.HIT and plan.tokens == 40
    assert plan.kv is not None and plan.kv["remote_num_tokens"] == 40
    assert plan.kv["remote_block_ids"] == [list(range(10, 20))]


def test_edited_history_lowers_tokens_and_cuts_blocks() -> None:
    held = list(range(100, 140))
    prompt = [*held[:21], 1, 2, 3, *held[24:], 5]
    plan = plan_reuse(entry(held, 10), prompt, threshold=8)
    assert plan.outcome is Outcome.HIT and plan.tokens == 21
    assert plan.kv is not None and plan.kv["remote_num_tokens"] == 21
    # 21 tokens at block size 4 live in the first 6 blocks; the list must end there
    assert plan.kv["remote_block_ids"] == [[10, 11, 12, 13, 14, 15]]


def test_truncated_history_reuses_only_the_kept_prefix() -> None:
    held = list(range(100, 140))
    plan = plan_reuse(entry(held, 10), held[:30], threshold=8)
    assert plan.tokens == 29  # the last prompt token is always computed by prefill
    assert plan.kv is not None and plan.kv["remote_block_ids"] == [list(range(10, 18))]


def test_edit_near_the_start_skips_reuse_as_prefix_mismatch() -> None:
    held = list(range(100, 140))
    plan = plan_reuse(entry(held, 10), [1, *held[1:], 3], threshold=8)
    assert plan.outcome is Outcome.PREFIX_MISMATCH and plan.kv is None


def test_short_conversation_is_below_threshold() -> None:
    held = list(range(100, 105))
    plan = plan_reuse(entry(held, 2), [*held, 1, 2], threshold=8)
    assert plan.outcome is Outcome.BELOW_THRESHOLD and plan.kv is None


def test_unknown_block_size_refuses_to_cut() -> None:
    held = list(range(100, 140))
    plan = plan_reuse(entry(held, 3, block_size=None), held[:30], threshold=8)
    # 40 tokens in 3 blocks fits block sizes 16 only -> inferable; 30 tokens -> 2 blocks
    assert plan.kv is not None and plan.kv["remote_block_ids"] == [[10, 11]]
    ambiguous = plan_reuse(entry(held[:10], 1, block_size=None), [*held[:9], 0], threshold=2)
    assert ambiguous.outcome is Outcome.PREFIX_MISMATCH


def test_entry_checks_deadline_holder_and_generation() -> None:
    eps = [ep("decode", "http://d0")]
    e = entry(list(range(20)), 5, deadline=100.0)
    assert check_entry(None, 0, eps, "g1") is Outcome.MISS
    assert check_entry(e, 50, eps, "g1") is None
    assert check_entry(e, 100, eps, "g1") is Outcome.EXPIRED
    assert check_entry(e, 50, eps, "g2") is Outcome.EXPIRED
    eps[0].healthy = False
    assert check_entry(e, 50, eps, "g1") is Outcome.EXPIRED


def test_client_kv_transfer_params_never_survive() -> None:
    body, wants = clean_client_body(
        {"messages": [], "kv_transfer_params": {"remote_host": "evil"}, "conversation_id": "x"}
    )
    assert "kv_transfer_params" not in body and "conversation_id" not in body and not wants
    p = prefill_body(body, True, None)
    assert p["kv_transfer_params"] == FRESH_PREFILL_KV
    d = decode_body(body, None, want_token_ids=False)
    assert "kv_transfer_params" not in d


def test_prefill_body_is_one_token_unstreamed() -> None:
    p = prefill_body(
        {"stream": True, "stream_options": {"include_usage": True}, "max_tokens": 99, "min_tokens": 3}, False, None
    )
    assert p["stream"] is False and p["max_tokens"] == 1 and "stream_options" not in p
    assert "min_tokens" not in p and "max_completion_tokens" not in p


def test_entry_holds_exactly_remote_num_tokens_ids() -> None:
    kv = {"remote_num_tokens": 6, "remote_block_ids": [[1, 2]], "remote_blocks_expiry_time": 5.0}
    e = make_entry(kv, [1, 2, 3, 4], [5, 6, 7], ep("decode", "d"), 10.0, 450.0)
    assert e is not None and e.token_ids == [1, 2, 3, 4, 5, 6] and e.deadline == 460.0
    assert make_entry({**kv, "remote_blocks_expiry_time": None}, [1], [2], ep("decode", "d"), 0, 1) is None
    assert make_entry({**kv, "remote_num_tokens": 9}, [1, 2], [3], ep("decode", "d"), 0, 1) is None


def test_tokenize_body_mirrors_chat_template_args_and_skips_media() -> None:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "chat_template_kwargs": {"enable_thinking": False},
        "temperature": 0,
    }
    tok = tokenize_body(body, True, "Qwen")
    assert tok == {"messages": body["messages"], "chat_template_kwargs": {"enable_thinking": False}, "model": "Qwen"}
    media = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    assert tokenize_body(media, True, None) is None


def test_prefix_helpers() -> None:
    a = list(range(1000))
    b = [*a[:700], -1, *a[701:]]
    assert common_prefix_len(a, b) == 700
    assert common_prefix_len(a, a[:5]) == 5
    assert common_prefix_len([], a) == 0
    assert cut_block_ids([[1, 2, 3], [4, 5, 6]], 2) == [[1, 2], [4, 5]]
    assert infer_block_size(307, 20) == 16


def test_completion_prompt_is_pinned_to_the_compared_ids() -> None:
    body = {"model": "m", "prompt": "hello there", "max_tokens": 4}
    pinned = pin_completion_prompt(body, [5, 6, 7])
    assert pinned["prompt"] == [5, 6, 7] and body["prompt"] == "hello there"


def test_prompt_ids_agree_only_when_equal_or_unknown() -> None:
    assert prompt_ids_agree([1, 2, 3], [1, 2, 3])
    assert not prompt_ids_agree([1, 2, 3], [1, 3, 2])
    assert not prompt_ids_agree([1, 2], [1, 2, 3])
    assert prompt_ids_agree(None, [1, 2])  # no reuse planned: nothing to compare
    assert prompt_ids_agree([1, 2], None)  # decode's ids not asked for


def test_prefill_on_ids_keeps_only_what_a_prefill_of_ids_needs() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.3,
        "stream": True,
        "max_tokens": 50,
        "cache_salt": "s",
        "tools": [{"type": "function"}],
    }
    kv = {"remote_num_tokens": 5, "do_remote_decode": True}
    out = prefill_on_ids(body, [1, 2, 3], kv)
    assert out == {
        "model": "m",
        "cache_salt": "s",
        "prompt": [1, 2, 3],
        "max_tokens": 1,
        "stream": False,
        "n": 1,
        "kv_transfer_params": kv,
    }
    assert out["kv_transfer_params"] is not kv  # the plan's dict stays the plan's


def test_tokenize_gets_the_tools_even_with_tool_choice_none_as_vllm_renders_them() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": tools, "tool_choice": "none"}
    tok = tokenize_body(body, True, "m")
    assert tok is not None and tok["tools"] == tools


def test_only_plainly_rendered_chats_prefill_on_ids() -> None:
    plain = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.2}
    assert renders_plainly(plain)
    for extra in ({"tools": []}, {"tool_choice": "none"}, {"reasoning_effort": "low"}, {"chat_template_kwargs": {}}):
        assert not renders_plainly({**plain, **extra}), extra
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert not renders_plainly(parts)


def test_prefill_request_picks_the_path_and_pins_ids_only_with_reuse() -> None:
    chat_body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9}
    kv = {"remote_num_tokens": 2, "do_remote_decode": True}
    path, body = prefill_request(chat_body, True, "/v1/chat/completions", None, [1, 2, 3])
    assert path == "/v1/chat/completions" and body["kv_transfer_params"] == FRESH_PREFILL_KV
    path, body = prefill_request(chat_body, True, "/v1/chat/completions", kv, [1, 2, 3])
    assert path == "/v1/completions" and body["prompt"] == [1, 2, 3] and body["kv_transfer_params"] == kv
    tools = {**chat_body, "tools": [{"type": "function"}]}
    path, body = prefill_request(tools, True, "/v1/chat/completions", kv, [1, 2, 3])
    assert path == "/v1/chat/completions" and "prompt" not in body and body["kv_transfer_params"] == kv
    completion = {"model": "m", "prompt": "hi there", "max_tokens": 9}
    path, body = prefill_request(completion, False, "/v1/completions", kv, [1, 2, 3])
    assert path == "/v1/completions" and body["prompt"] == [1, 2, 3] and body["max_tokens"] == 1
