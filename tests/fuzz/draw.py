"""One input generator for two drivers: hypothesis in `make test` (which shrinks a failure to
a small case) and a seeded random loop in `make fuzz` (millions of inputs a run, where
hypothesis would spend most of its time in its own bookkeeping). Both explore one space."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol, TypeVar

from hypothesis import strategies as st

T = TypeVar("T")


class Draw(Protocol):
    def integer(self, lo: int, hi: int) -> int: ...

    def choice(self, options: Sequence[T]) -> T: ...

    def chance(self, p: float) -> bool:
        """True with probability p (hypothesis shrinks it towards False)."""
        ...

    def raw(self, lo: int, hi: int) -> bytes: ...


class RandomDraw:
    """The long run's draws: a seeded `random.Random`."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def raw(self, lo: int, hi: int) -> bytes:
        return self.rng.randbytes(self.rng.randint(lo, hi))


_INTEGERS: dict[tuple[int, int], st.SearchStrategy[int]] = {}  # (built once: a strategy per draw cost a third)


def _integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    got = _INTEGERS.get((lo, hi))
    if got is None:
        got = _INTEGERS[(lo, hi)] = st.integers(lo, hi)
    return got


class HypothesisDraw:
    """The CI's draws, from one `st.data()`: every choice is shrinkable."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def integer(self, lo: int, hi: int) -> int:
        return self.data.draw(_integers(lo, hi))

    def choice(self, options: Sequence[T]) -> T:
        return options[self.data.draw(_integers(0, len(options) - 1))]

    def chance(self, p: float) -> bool:
        return self.data.draw(_integers(0, 999)) >= 1000 - int(p * 1000)

    def raw(self, lo: int, hi: int) -> bytes:
        return self.data.draw(st.binary(min_size=lo, max_size=hi))
