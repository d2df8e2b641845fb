"""Tenants apart inside the engines: the router gives each tenant's requests a cache_salt of its own
(router.tenancy.cacheIsolation), so vLLM shares no cached block across tenants (issue 44)."""

from __future__ import annotations

from typing import Any

from pdx_contract.router_config import TenancyConfig
from pdx_router.policy.shapes import ClientRequest, Front, client_request

BY_KEY = Front(TenancyConfig(identity="apiKey"))
SHARED = Front(TenancyConfig(identity="apiKey", cache_isolation="shared"))
BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "the same system prompt"}]}


def ask(front: Front, key: str | None, **extra: Any) -> ClientRequest:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return client_request({**BODY, **extra}, headers, "/v1/chat/completions", True, front)


def test_each_tenant_gets_a_salt_of_its_own_for_the_same_prompt() -> None:
    a, a_again, b = ask(BY_KEY, "key-a"), ask(BY_KEY, "key-a"), ask(BY_KEY, "key-b")
    assert a.body["cache_salt"] == a_again.body["cache_salt"]  # a tenant still hits its own cache
    assert a.body["cache_salt"] != b.body["cache_salt"]
    assert a.scope != b.scope


def test_a_clients_salt_is_folded_into_its_tenants_never_taken_alone() -> None:
    a = ask(BY_KEY, "key-a")
    b_posing = ask(BY_KEY, "key-b", cache_salt=a.body["cache_salt"])  # b sends a's salt as its own
    assert b_posing.body["cache_salt"] not in (a.body["cache_salt"], ask(BY_KEY, "key-b").body["cache_salt"])
    own = ask(BY_KEY, "key-a", cache_salt="doc-42")
    assert own.body["cache_salt"] not in ("doc-42", a.body["cache_salt"])  # a client's own split still holds


def test_shared_isolation_leaves_the_clients_salt_as_sent() -> None:
    assert "cache_salt" not in ask(SHARED, "key-a").body
    assert ask(SHARED, "key-a", cache_salt="doc-42").body["cache_salt"] == "doc-42"


def test_a_client_without_an_identity_keeps_its_own_salt_or_none() -> None:
    assert "cache_salt" not in ask(BY_KEY, None).body
    assert ask(BY_KEY, None, cache_salt="mine").body["cache_salt"] == "mine"
