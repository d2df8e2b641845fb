"""The request each hop gets: what the client may not control, prefill's one token, decode's
pinned prompt, and /tokenize rendering like the completion."""

from __future__ import annotations

from typing import Any

import orjson

from pdx_contract.router_config import TenancyConfig
from pdx_router.chat_tokens import renders_plainly
from pdx_router.ids import of_list
from pdx_router.policy.shapes import (
    FRESH_PREFILL_KV,
    ClientRequest,
    Front,
    clean_client_body,
    client_request,
    decode_body,
    decode_request,
    pin_completion_prompt,
    prefill_body,
    prefill_on_ids,
    prefill_request,
    tokenize_body,
)

SINGLE = Front(TenancyConfig(identity="single"))
BY_KEY = Front(TenancyConfig(identity="apiKey"))


def json(body: dict[str, Any]) -> Any:
    """A body as the engine reads it (ids go in as pre-encoded JSON fragments)."""
    return orjson.loads(orjson.dumps(body))


def ask(
    body: dict[str, Any], path: str = "/v1/chat/completions", front: Front = SINGLE, **headers: str
) -> ClientRequest:
    return client_request(body, headers, path, path.endswith("/chat/completions"), front)


def test_client_kv_transfer_params_never_survive() -> None:
    body, wants = clean_client_body(
        {"messages": [], "kv_transfer_params": {"remote_host": "evil"}, "conversation_id": "x"}
    )
    assert "kv_transfer_params" not in body and "conversation_id" not in body and not wants
    p = prefill_body(body, True, None)
    assert p["kv_transfer_params"] == FRESH_PREFILL_KV
    d = decode_body(body, None, want_token_ids=False)
    assert "kv_transfer_params" not in d


def test_a_clients_first_token_for_decode_never_survives() -> None:
    body, _ = clean_client_body({"messages": [], "vllm_xargs": {"pdx_first_token": 7, "mine": 1}})
    assert body["vllm_xargs"] == {"mine": 1}  # the router's key goes, the client's own stays


def test_prefill_body_is_one_token_unstreamed() -> None:
    p = prefill_body(
        {"stream": True, "stream_options": {"include_usage": True}, "max_tokens": 99, "min_tokens": 3}, False, None
    )
    assert p["stream"] is False and p["max_tokens"] == 1 and "stream_options" not in p
    assert "min_tokens" not in p and "max_completion_tokens" not in p


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


def test_completion_prompt_is_pinned_to_the_compared_ids() -> None:
    body = {"model": "m", "prompt": "hello there", "max_tokens": 4}
    pinned = json(pin_completion_prompt(body, of_list([5, 6, 7])))
    assert pinned["prompt"] == [5, 6, 7] and body["prompt"] == "hello there"


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
    out = json(prefill_on_ids(body, of_list([1, 2, 3]), kv))
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
    extras: list[dict[str, Any]] = [
        {"tools": []},
        {"tool_choice": "none"},
        {"reasoning_effort": "low"},
        {"chat_template_kwargs": {}},
    ]
    for extra in extras:
        assert not renders_plainly({**plain, **extra}), extra
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert not renders_plainly(parts)


def test_prefill_request_picks_the_path_and_pins_ids_only_with_reuse() -> None:
    chat_body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9}
    kv = {"remote_num_tokens": 2, "do_remote_decode": True}
    path, body = prefill_request(ask(chat_body), None, of_list([1, 2, 3]))
    assert path == "/v1/chat/completions" and body["kv_transfer_params"] == FRESH_PREFILL_KV
    path, body = prefill_request(ask(chat_body), kv, of_list([1, 2, 3]))
    body = json(body)
    assert path == "/v1/completions" and body["prompt"] == [1, 2, 3] and body["kv_transfer_params"] == kv
    tools = {**chat_body, "tools": [{"type": "function"}]}
    path, body = prefill_request(ask(tools), kv, of_list([1, 2, 3]))
    assert path == "/v1/chat/completions" and "prompt" not in body and body["kv_transfer_params"] == kv
    completion = {"model": "m", "prompt": "hi there", "max_tokens": 9}
    path, body = prefill_request(ask(completion, "/v1/completions"), kv, of_list([1, 2, 3]))
    body = json(body)
    assert path == "/v1/completions" and body["prompt"] == [1, 2, 3] and body["max_tokens"] == 1


def test_decode_runs_a_reused_completions_prompt_on_the_compared_ids_but_renders_a_chat() -> None:
    pkv = {"do_remote_prefill": True, "remote_engine_id": "prefill-0"}
    completion = ask({"model": "m", "prompt": "hi there", "conversation_id": "c"}, "/v1/completions")
    body = json(decode_request(completion, pkv, of_list([1, 2, 3])))
    assert body["prompt"] == [1, 2, 3] and body["kv_transfer_params"] == pkv and body["return_token_ids"] is True
    assert decode_request(completion, pkv, None)["prompt"] == "hi there"  # no reuse: no pin
    chat = ask({"model": "m", "messages": [{"role": "user", "content": "hi"}], "conversation_id": "c"})
    body = json(decode_request(chat, pkv, of_list([1, 2, 3])))
    assert "prompt" not in body and body["messages"] == chat.body["messages"]


def test_decode_is_asked_for_ids_only_for_one_choice_of_a_known_conversation() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    assert decode_request(ask({"messages": msgs, "conversation_id": "c"}), None, None)["return_token_ids"] is True
    assert decode_request(ask({"messages": msgs}), None, None)["return_token_ids"] is True  # by history
    ids_only = Front(SINGLE.tenancy, conversation_from="id")
    assert "return_token_ids" not in decode_request(ask({"messages": msgs}, front=ids_only), None, None)
    several = ask({"messages": msgs, "conversation_id": "c", "n": 2})
    assert not several.capture and "return_token_ids" not in decode_request(several, None, None)


def test_the_conversation_is_named_by_body_or_session_header_and_scoped_by_api_key() -> None:
    body = {"messages": [], "conversation_id": "c1"}
    a = ask(body, front=BY_KEY, Authorization="Bearer key-a")
    assert a.key is not None and "conversation_id" not in a.body
    assert a.key != ask(body, front=BY_KEY, Authorization="Bearer key-b").key  # another tenant, another entry
    by_header = {"X-Session-ID": "c1", "Authorization": "Bearer key-a"}
    assert client_request({"messages": []}, by_header, "/v1/chat/completions", True, BY_KEY).key == a.key
    assert ask({"messages": []}, front=BY_KEY).key is None


def test_engines_get_the_api_key_and_no_other_client_header() -> None:
    sent = {"Authorization": "Bearer k", "Cookie": "secret", "X-Session-ID": "s"}
    req = client_request({"messages": []}, sent, "/v1/chat/completions", True, SINGLE)
    assert req.headers == {"Authorization": "Bearer k"}
    assert ask({"messages": []}, Cookie="secret").headers == {}
