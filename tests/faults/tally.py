"""The fault suite's figures, filled in by the tests and printed at the end of the session."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Tally:
    injected: list[str] = field(default_factory=list)
    survived: list[str] = field(default_factory=list)
    turns: int = 0  # client requests sent while a fault was in play or after it
    lost: int = 0  # of those, answered with an error the fault did not justify, or hung
    expected_errors: int = 0  # the faulted turn itself, ended with an error that names it
    cut: int = 0  # turns in flight when the router itself died: the connection cut, no [DONE]
    reads: int = 0  # D->P reads the fake prefills checked
    wrong_kv: int = 0  # of those, reads of KV decode did not hold for those positions
    soak: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [
            f"faults injected: {len(self.injected)}, survived: {len(self.survived)}",
            f"client requests: {self.turns}, lost: {self.lost}, "
            f"ended with the fault's own named error: {self.expected_errors}, "
            f"cut off (no [DONE]) by the router's own death: {self.cut}",
            f"D->P reads checked: {self.reads}, turns served from wrong KV: {self.wrong_kv}",
        ]
        missed = [f for f in self.injected if f not in self.survived]
        if missed:
            out.append("not survived: " + ", ".join(missed))
        if self.soak:
            out.append("soak: " + ", ".join(f"{k}={v:g}" for k, v in self.soak.items()))
        out += self.notes
        return out


TALLY = Tally()
