"""endpoints.json: the ready engine pods, published by the operator, polled by the router."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Document
from .router_config import EngineUrl

Role = Literal["prefill", "decode"]


class PublishedEndpoint(Document):
    role: Role
    url: EngineUrl
    generation: str | None = None
    """The engine's config generation; unset: the router config's own."""
    name: str = ""
    """The pod's name, for logs."""
    draining: bool = False
    """A decode being scaled away: it decodes no turn, but prefill still reads the KV it holds,
    so its conversations move to another decode without recomputing their history."""


class EndpointsDocument(Document):
    endpoints: tuple[PublishedEndpoint, ...] = Field(default=())

    def generations(self) -> set[str | None]:
        return {e.generation for e in self.endpoints}
