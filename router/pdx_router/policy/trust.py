"""Whether the router's own tokenizer's ids may stand in for the engine's.

The router renders the chat template itself, so its ids are only used once they have agreed
with the engine's on whole prompts; one disagreement, ever, means the engine tokenizes for
the life of the process (a wrong id would make a reuse decision on the wrong prefix).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

# Whole prompts the router's tokenizer must get right before its ids replace /tokenize.
PROBATION_TURNS = 8

TrustState = Literal["probation", "trusted", "disabled"]


@dataclass(frozen=True)
class TokenizerTrust:
    """On probation until `needed` prompts matched the engine's ids; disabled by one mismatch."""

    needed: int = PROBATION_TURNS
    agreed: int = 0
    off: bool = False

    @property
    def trusted(self) -> bool:
        return not self.off and self.agreed >= self.needed

    @property
    def state(self) -> TrustState:
        return "disabled" if self.off else "trusted" if self.trusted else "probation"

    def after_match(self) -> TokenizerTrust:
        return self if self.off else replace(self, agreed=self.agreed + 1)

    def after_mismatch(self) -> TokenizerTrust:
        return replace(self, off=True)
