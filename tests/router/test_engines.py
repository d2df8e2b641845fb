"""Which engines serve a turn: one generation, least loaded, and decode affinity."""

from __future__ import annotations

from pdx_router.policy.engines import choose_decode, choose_generation, choose_prefill

from .helpers import ep


def test_configured_generation_preferred_when_it_has_a_pair() -> None:
    eps = [ep("prefill", "p1", "old"), ep("decode", "d1", "old"), ep("prefill", "p2", "new"), ep("decode", "d2", "new")]
    assert choose_generation(eps, "new") == "new"


def test_generation_with_most_pairs_when_configured_has_none() -> None:
    eps = [
        ep("prefill", "p1", "old"),
        ep("prefill", "p2", "old"),
        ep("decode", "d1", "old"),
        ep("decode", "d2", "old"),
        ep("prefill", "p3", "mid"),
        ep("decode", "d3", "mid"),
        ep("prefill", "p4", "new"),
        ep("decode", "d4", "new", healthy=False),
    ]
    assert choose_generation(eps, "new") == "old"


def test_no_generation_without_a_healthy_pair() -> None:
    eps = [ep("prefill", "p1", "a"), ep("decode", "d1", "b")]
    assert choose_generation(eps, "a") is None


def test_prefill_and_decode_never_cross_generations() -> None:
    eps = [
        ep("prefill", "p-old", "old"),
        ep("decode", "d-old", "old"),
        ep("prefill", "p-new", "new"),
        ep("decode", "d-new", "new"),
    ]
    assert choose_prefill(eps, "new").url == "p-new"  # type: ignore[union-attr]
    assert choose_decode(eps, "new", affinity_url="d-old").url == "d-new"  # type: ignore[union-attr]


def test_least_outstanding_wins() -> None:
    eps = [ep("prefill", "p1", load=3), ep("prefill", "p2", load=1), ep("prefill", "p3", load=2)]
    assert choose_prefill(eps, "g1").url == "p2"  # type: ignore[union-attr]


def test_decode_affinity_only_when_healthy() -> None:
    eps = [ep("decode", "d1", load=0), ep("decode", "d2", load=9)]
    assert choose_decode(eps, "g1", "d2").url == "d2"  # type: ignore[union-attr]
    eps[1].healthy = False
    assert choose_decode(eps, "g1", "d2").url == "d1"  # type: ignore[union-attr]
