"""router.json: what the renderer writes and pdx-router reads. Each default lives here, once."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from .base import Document, check_url

Port = Annotated[int, Field(gt=0, lt=65536)]
EngineUrl = Annotated[str, AfterValidator(check_url)]


class DnsConfig(Document):
    """The engines' headless Services, resolved every `refreshSeconds`."""

    prefill: str = Field(min_length=1)
    decode: str = Field(min_length=1)
    port: Port = 8000
    refresh_seconds: float = Field(default=5.0, gt=0)


# The store's default byte bound: ~8,000 conversations of 16k tokens.
DEFAULT_STORE_BYTES = 512 * 1024 * 1024
# The claim gate's budget in prompt tokens, about a second of a GPU prefill's work; the operator
# renders less for CPU engines (pdx.spec.CPU_CLAIM_QUEUE_TOKENS).
CLAIM_QUEUE_TOKENS = 32768


class StoreConfig(Document):
    """Where conversation entries live: in the router's memory, or Redis for several routers."""

    kind: Literal["memory", "redis"] = "memory"
    url: str | None = None
    key_prefix: str = "pdx:"
    max_bytes: int = Field(default=DEFAULT_STORE_BYTES, ge=1)
    """The entries' bytes, all tenants together (ids as their text, ~6.5 bytes a token; kv
    JSON; a fixed overhead each): beyond it, the oldest go. In memory, per router replica."""
    max_bytes_per_tenant: int | None = Field(default=None, ge=1)
    """One tenant's share: a tenant beyond it drops its own oldest entries, never another's.
    Unset: a quarter of maxBytes."""

    def tenant_bytes(self) -> int:
        return self.max_bytes_per_tenant if self.max_bytes_per_tenant is not None else max(1, self.max_bytes // 4)

    @model_validator(mode="after")
    def _redis_needs_a_url(self) -> StoreConfig:
        if self.kind == "redis" and not (self.url or "").startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("store.url: kind 'redis' needs a URL like 'redis://host:6379/0'")
        return self


TenantIdentity = Literal["apiKey", "header", "single"]
CacheIsolation = Literal["tenant", "shared"]  # the CR's router.tenancy.cacheIsolation takes these
ConversationFrom = Literal["id", "history", "both"]


class TenancyConfig(Document):
    """How the router tells tenants apart: conversations (and their KV) are shared only within one.

    - `apiKey`: the client's Authorization header; a client without one has no identity.
    - `header`: a header a trusted gateway sets, overwriting whatever the client sent, combined
      with the API key when there is one; a request without the header has no identity.
    - `single`: one trusted client (the local demo, a benchmark): everyone is one tenant.

    A turn without an identity is plain P/D: nothing is read from or written to the store.

    `cache_isolation`: `tenant` (the default) gives each tenant's requests a `cache_salt` of its
    own, so no engine cache (prefill's, decode's, held KV) shares a block across tenants and none
    can tell from TTFT what another recently sent; `shared` leaves the client's salt as sent.
    """

    identity: TenantIdentity = "apiKey"
    header: str | None = Field(default=None, min_length=1)
    cache_isolation: CacheIsolation = "tenant"

    @model_validator(mode="after")
    def _header_iff_header_identity(self) -> TenancyConfig:
        if self.identity == "header" and not self.header:
            raise ValueError("tenancy.header: identity 'header' needs the header's name, e.g. 'X-Tenant'")
        if self.identity != "header" and self.header:
            raise ValueError(f"tenancy.header: only read with identity 'header' (identity is {self.identity!r})")
        return self


class RouterConfig(Document):
    host: str = "0.0.0.0"
    port: Port = 8000
    served_model_name: str = "default"
    generation: str = "default"
    """The engine config generation; only engines of one generation are paired."""
    prefill: tuple[EngineUrl, ...] = ()
    decode: tuple[EngineUrl, ...] = ()
    endpoints_file: str | None = None
    """The operator's endpoints.json (see `endpoints`), re-read when it changes."""
    dns: DnsConfig | None = None
    conversation_ttl_seconds: float = Field(default=450.0, gt=0)
    """An entry's deadline: it must end before decode frees the blocks (decoder TTL - margin)."""
    kv_recompute_threshold: int = Field(default=64, ge=0)
    max_entries: int = Field(default=100_000, ge=1)
    tenancy: TenancyConfig = TenancyConfig()
    conversation_from: ConversationFrom = "both"
    """How a turn finds its conversation's entry: `id` (the body's `conversation_id` or the
    X-Session-ID header), `history` (the digest of the messages up to an assistant turn, for
    clients that send no id), or `both` (an id when sent, else the history)."""
    decode_local_max_tokens: int = Field(default=0, ge=0)
    """A follow-up turn whose new tokens, beyond what its conversation's decode holds, are at
    most this many is prefilled on that decode from its own prefix cache: no prefill hop, no
    D->P read. 0: every turn goes through prefill."""
    decode_local_max_busy: int = Field(default=4, ge=1)
    """Such a turn goes local only while its decode has fewer requests than this in flight
    (the router's own count, or the engine's running + waiting, whichever is higher): a local
    prefill delays the tokens of every stream that decode is generating."""
    decode_local_idle_max_tokens: int = Field(default=0, ge=0)
    """While that decode has nothing in flight (the same count), a turn of up to this many new
    tokens goes local too: an idle decode delays nobody. Below decode_local_max_tokens it changes
    nothing; decode-local off (0 above) turns it off too."""
    claim_queue_tokens: int = Field(default=CLAIM_QUEUE_TOKENS, ge=0)
    """A turn that reads held KV claims its hold only once its prefill has at most this many
    prompt tokens (estimated) of the router's requests in flight; until then it waits in the
    router, its hold unclaimed (so still releasable under pressure), and turns behind it wait too.
    High: claim on arrival."""
    first_token_from_prefill: bool = False
    """A streamed P/D turn's first token is prefill's, sent as soon as prefill answers; decode is
    asked to start with it (its `pdx_engine.first_token` logits processor) and what it streams of
    it is cut (policy.first_token). Off: the client's first token is decode's."""
    prefill_affinity: bool = False
    """Send every turn of a conversation to one prefill, chosen by rendezvous hashing of the
    conversation (its id, else its messages through the first user message), so that prefill's
    prefix cache may still hold the history; off: the least loaded prefill."""
    reuse_headers: bool = False
    """Answer with X-PDX-Reuse, X-PDX-Reused-Tokens, X-PDX-Prefill-Ms and X-PDX-Router-Ms: facts
    about the stored entries, so only for a trusted client (the local demo, `pdx bench`)."""
    engine_api_key_file: str | None = None
    """A file holding the engines' API key (vLLM's --api-key): sent to the engines as
    `Authorization: Bearer`, in place of the client's, which the engines never see."""
    store: StoreConfig = StoreConfig()
    max_request_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    upstream_timeout_seconds: float = Field(default=600.0, gt=0)
    header_timeout_seconds: float = Field(default=10.0, gt=0)
    """A client connection that has not sent a whole request line and headers this long after
    its first byte is closed (408): a slow sender holds no connection for long."""
    body_timeout_seconds: float = Field(default=60.0, gt=0)
    """The whole request body must arrive within this (else 408). 60 s carries maxRequestBytes
    at ~280 KB/s. Answers are not timed: a stream goes to a slow reader as fast as it reads."""
    max_connections: int = Field(default=4096, ge=1)
    """Open client connections above this are refused with 503 at once (file descriptors,
    memory); each streamed turn holds one, plus its decode connection."""
    health_check_interval_seconds: float = Field(default=5.0, gt=0)
    tokenizer: str | None = None
    """The model directory (tokenizer.json, tokenizer_config.json) the engines serve: reused
    chat turns are then tokenized by the router instead of by a /tokenize call."""


def upgraded(data: Any) -> Any:
    """router.json as an older operator wrote it, in today's form: the tenant header at the
    top reads as identity 'header' (a null one as the default), so an upgrade loses nothing.
    (A plain function: a before-validator would make pydantic read the JSON as Python, where
    strict mode refuses a list for a tuple.)"""
    if isinstance(data, dict) and "tenantHeader" in data:
        data = dict(data)
        header = data.pop("tenantHeader")
        if header is not None and "tenancy" not in data:
            data["tenancy"] = {"identity": "header", "header": header}
    return data
