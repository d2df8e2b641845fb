"""router.json: what the renderer writes and pdx-router reads. Each default lives here, once."""

from __future__ import annotations

from typing import Annotated, Literal

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


class StoreConfig(Document):
    """Where conversation entries live: in the router's memory, or Redis for several routers."""

    kind: Literal["memory", "redis"] = "memory"
    url: str | None = None
    key_prefix: str = "pdx:"
    max_bytes: int = Field(default=DEFAULT_STORE_BYTES, ge=1)
    """The entries' bytes, all tenants together (ids at 4 bytes a token, kv JSON, a fixed
    overhead each): beyond it, the oldest go. In memory, per router replica."""
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
    tenant_header: str | None = None
    store: StoreConfig = StoreConfig()
    max_request_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    upstream_timeout_seconds: float = Field(default=600.0, gt=0)
    health_check_interval_seconds: float = Field(default=5.0, gt=0)
    tokenizer: str | None = None
    """The model directory (tokenizer.json, tokenizer_config.json) the engines serve: reused
    chat turns are then tokenized by the router instead of by a /tokenize call."""
