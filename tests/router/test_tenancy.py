"""Tenants cannot read, consume, replace or learn anything of each other's entries, and the
engines answer only the router (the review's bypass and oracle, issue 16; engine key, issue 15)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from pdx_contract.router_config import TenancyConfig
from pdx_router.app import build
from pdx_router.config import ConfigError, RouterConfig
from pdx_router.store import MemoryStore

from .conftest import Stack, StackFactory
from .helpers import LONG, assistant, chat, user

BY_KEY = TenancyConfig(identity="apiKey")
BY_GATEWAY = TenancyConfig(identity="header", header="X-Tenant")
A = {"Authorization": "Bearer key-a"}
B = {"Authorization": "Bearer key-b"}


def _entries(s: Stack) -> dict[str, Any]:
    store = s.router.store
    assert isinstance(store, MemoryStore)
    return dict(store._items)


async def _a_stored_turn(http: aiohttp.ClientSession, s: Stack, headers: dict[str, str]) -> list[dict[str, Any]]:
    """Tenant A's first turn of conversation 'shared-id'; returns the next turn's messages."""
    status, _, data = await chat(http, s.url, [user(LONG)], conversation="shared-id", headers=headers)
    assert status == 200
    return [user(LONG), assistant(data["choices"][0]["message"]["content"]), user("next")]


async def test_clients_without_an_api_key_share_no_conversation(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(tenancy=BY_KEY)
    msgs = await _a_stored_turn(http, s, {})
    assert _entries(s) == {}  # no identity: nothing kept for anyone to find
    _, h, _ = await chat(http, s.url, msgs, conversation="shared-id")
    assert h["X-PDX-Reuse"] == "none" and s.cluster.reads == []


async def test_another_api_key_neither_reads_consumes_nor_replaces_the_entry(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(tenancy=BY_KEY)
    msgs = await _a_stored_turn(http, s, A)
    ((a_key, a_entry),) = _entries(s).items()
    probes = (msgs, msgs[:1], [user(LONG[: len(LONG) // 2])])  # the review's guesses, each by another key
    for i, guess in enumerate(probes):
        _, h, _ = await chat(http, s.url, guess, conversation="shared-id", headers={"Authorization": f"Bearer b{i}"})
        assert h["X-PDX-Reuse"] == "miss" and h["X-PDX-Reused-Tokens"] == "0"
    assert s.cluster.reads == []
    assert _entries(s)[a_key] == a_entry  # A's entry is where A left it, B's are apart
    _, h, _ = await chat(http, s.url, msgs, conversation="shared-id", headers=A)
    assert h["X-PDX-Reuse"] == "hit" and all(r.correct for r in s.cluster.reads)


async def test_a_tenant_header_set_by_the_client_does_not_reach_the_gateways_tenant(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    """The review's bypass: B sent `X-Tenant: acme` itself and hit A's entry. The tenant is
    the gateway's header combined with the API key, so a forged header alone names nobody."""
    s = await make_stack(tenancy=BY_GATEWAY)
    msgs = await _a_stored_turn(http, s, {"X-Tenant": "acme", **A})
    for forged in ({"X-Tenant": "acme", **B}, {"X-Tenant": "acme"}):
        _, h, _ = await chat(http, s.url, msgs, conversation="shared-id", headers=forged)
        assert h["X-PDX-Reuse"] == "miss", forged
    _, h, _ = await chat(http, s.url, msgs, conversation="shared-id", headers=B)
    assert h["X-PDX-Reuse"] == "none"  # no gateway header: no identity
    _, h, _ = await chat(http, s.url, msgs, conversation="shared-id", headers={"X-Tenant": "acme", **A})
    assert h["X-PDX-Reuse"] == "hit"


@pytest.mark.parametrize("name", ["Authorization", "X-Tenant"])
async def test_an_identity_header_sent_twice_is_refused(make_stack: StackFactory, name: str) -> None:
    s = await make_stack(tenancy=BY_GATEWAY)
    body = orjson.dumps({"model": "Qwen", "messages": [user(LONG)], "conversation_id": "c1"})
    others = [(n, "acme") for n in ("X-Tenant", "Authorization") if n != name]
    headers = [(name, "Bearer one"), (name, "Bearer two"), *others, ("Content-Type", "application/json")]
    async with (
        aiohttp.ClientSession() as http,
        http.post(s.url + "/v1/chat/completions", data=body, headers=headers) as r,
    ):
        err = (await r.json())["error"]
    assert r.status == 400 and err["message"] == f"{name}: header sent 2 times; send it once"
    assert s.prefill.requests == [] and _entries(s) == {}


async def test_reuse_facts_reach_clients_only_when_the_deployment_turns_them_on(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(tenancy=BY_KEY, reuse_headers=False)
    msgs = await _a_stored_turn(http, s, A)
    _, h, _ = await chat(http, s.url, msgs, conversation="shared-id", headers=A)
    assert not [k for k in h if k.lower().startswith("x-pdx-")], h
    assert s.router.metrics.stats(1, "off").reuse.hit == 1  # it did reuse; it just does not say
    assert len(h["X-Request-ID"]) == 32


async def test_single_tenancy_shares_conversations_among_all_clients(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(tenancy=TenancyConfig(identity="single"))
    msgs = await _a_stored_turn(http, s, A)
    _, h, _ = await chat(http, s.url, msgs, conversation="shared-id", headers=B)
    assert h["X-PDX-Reuse"] == "hit"


# ---------------------------------------------------------------- the KV scope


@pytest.mark.parametrize(
    ("first", "then"),
    [
        ({"model": "lora-x"}, {"model": "Qwen"}),
        ({"cache_salt": "B"}, {"cache_salt": "A"}),
        ({"model": "lora-x", "cache_salt": "B"}, {"model": "Qwen", "cache_salt": "A"}),
        ({}, {"cache_salt": "A"}),
    ],
    ids=["adapter", "cache_salt", "both", "salt_added"],
)
async def test_kv_is_reused_only_under_the_same_adapter_and_cache_salt(
    make_stack: StackFactory, http: aiohttp.ClientSession, first: dict[str, Any], then: dict[str, Any]
) -> None:
    s = await make_stack()
    status, _, data = await chat(http, s.url, [user(LONG)], **first)
    assert status == 200
    msgs = [user(LONG), assistant(data["choices"][0]["message"]["content"]), user("next")]
    _, h, _ = await chat(http, s.url, msgs, **then)
    assert h["X-PDX-Reuse"] == "miss" and s.cluster.reads == []
    _, h, _ = await chat(http, s.url, msgs, **first)  # the first scope's entry was left alone
    assert h["X-PDX-Reuse"] == "hit"


async def test_a_turn_with_images_is_neither_reused_nor_stored(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    """vLLM keys image KV on the image's hash, which token ids do not show."""
    s = await make_stack()
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}
    status, h, _ = await chat(http, s.url, [image, user(LONG)])
    assert status == 200 and h["X-PDX-Reuse"] == "none" and _entries(s) == {}


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("role", ["prefill", "decode"])
async def test_an_engine_failure_shows_the_client_a_generic_error_and_the_log_the_detail(
    make_stack: StackFactory, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture, role: str
) -> None:
    s = await make_stack(**{f"{role}_opts": {"fail_status": 500}})
    caplog.set_level(logging.WARNING, "pdx_router")
    body = {"model": "Qwen", "messages": [user(LONG)], "conversation_id": "c1"}
    async with http.post(s.url + "/v1/chat/completions", json=body, headers={"X-Request-ID": "req-42"}) as r:
        raw = await r.read()
    assert r.status == 502 and r.headers["X-Request-ID"] == "req-42"
    assert orjson.loads(raw)["error"] == {
        "message": f"the {role} engine failed",
        "type": "pdx_router_error",
        "code": 502,
        "request_id": "req-42",
    }
    assert b"CUDA" not in raw and b"127.0.0.1" not in raw
    assert "[req-42]" in caplog.text and "CUDA error" in caplog.text  # the detail: in the log


# ---------------------------------------------------------------- the engines' key


async def test_engines_get_the_routers_key_and_never_the_clients(
    make_stack: StackFactory, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("engine-secret\n")  # a Secret's file may end with a newline
    opts = {"api_key": "engine-secret"}
    s = await make_stack(tenancy=BY_KEY, engine_api_key_file=str(key_file), prefill_opts=opts, decode_opts=opts)
    msgs = await _a_stored_turn(http, s, A)
    status, h, data = await chat(http, s.url, msgs, conversation="shared-id", stream=True, headers=A)
    assert status == 200 and h["X-PDX-Reuse"] == "hit"
    seen = s.prefill.auth + s.decode.auth
    assert len(seen) >= 4 and set(seen) == {"Bearer engine-secret"}  # /tokenize included
    assert "engine-secret" not in repr((h, data))


async def test_without_the_routers_key_the_engines_refuse_the_clients_key(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    """What the key protects: engines with --api-key answer only whoever holds it."""
    opts = {"api_key": "engine-secret"}
    s = await make_stack(tenancy=BY_KEY, prefill_opts=opts, decode_opts=opts)
    status, _, _ = await chat(http, s.url, [user(LONG)], headers=A)
    assert status == 401


@pytest.mark.parametrize(("content", "problem"), [(None, "cannot read {}"), ("\n", "{} is empty")])
def test_an_unreadable_or_empty_engine_key_file_stops_the_router_naming_it(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    path = tmp_path / "key"
    if content is not None:
        path.write_text(content)
    cfg = RouterConfig(prefill=("http://127.0.0.1:1",), decode=("http://127.0.0.1:2",), engine_api_key_file=str(path))
    with pytest.raises(ConfigError, match="engineApiKeyFile: " + problem.format(path)):
        build(cfg)
