"""Engine endpoints as the router sees them: role, generation, health, load."""

from __future__ import annotations

from dataclasses import dataclass

from pdx_contract.endpoints import Role

__all__ = ["Endpoint", "Role"]


@dataclass(eq=False)
class Endpoint:
    """One engine. Mutable on purpose: health and outstanding count change per request."""

    url: str
    role: Role
    generation: str
    name: str = ""
    healthy: bool = True
    failures: int = 0  # consecutive failed health checks
    outstanding: int = 0
    block_size: int | None = None
    draining: bool = False  # decodes nothing; its entries are still read (see PublishedEndpoint)
    names_held: bool = False  # a decode whose last answer named the tokens it holds (kv_prefix)
    claims: bool | None = None  # answers claims on its held KV (policy.holds); False: no route, never asked again
    engine_load: int | None = None  # running + waiting requests, from its /metrics at the last health check
