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


class StoreConfig(Document):
    """Where conversation entries live: in the router's memory, or Redis for several routers."""

    kind: Literal["memory", "redis"] = "memory"
    url: str | None = None
    key_prefix: str = "pdx:"

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
