"""Engine endpoints as the router sees them: role, generation, health, load."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["prefill", "decode"]


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

    @property
    def key(self) -> tuple[str, str]:
        return (self.role, self.url)
