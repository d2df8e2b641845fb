"""Which engines serve a turn: one generation, least loaded, and decode affinity."""

from __future__ import annotations

from collections import Counter

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


def test_prefill_affinity_gives_a_conversation_the_same_prefill_whatever_the_load() -> None:
    eps = [ep("prefill", f"p{i}") for i in range(4)]
    first = choose_prefill(eps, "g1", affinity="conversation-a")
    assert first is not None
    for e in eps:
        e.outstanding = 9 if e is first else 0
    assert choose_prefill(eps, "g1", affinity="conversation-a") is first
    assert choose_prefill(eps, "g1") is not first  # without affinity: the least loaded


def test_prefill_affinity_spreads_conversations_and_a_lost_prefill_moves_only_its_own() -> None:
    eps = [ep("prefill", f"p{i}") for i in range(4)]
    keys = [f"conversation-{i}" for i in range(400)]
    before = {k: choose_prefill(eps, "g1", affinity=k).url for k in keys}  # type: ignore[union-attr]
    counts = Counter(before.values())
    assert set(counts) == {"p0", "p1", "p2", "p3"} and min(counts.values()) > 60
    eps[2].healthy = False
    after = {k: choose_prefill(eps, "g1", affinity=k).url for k in keys}  # type: ignore[union-attr]
    moved = {k for k in keys if after[k] != before[k]}
    assert moved == {k for k in keys if before[k] == "p2"}


def test_prefill_affinity_follows_the_pod_name_not_its_address() -> None:
    old = [ep("prefill", "http://10.0.0.1:8000"), ep("prefill", "http://10.0.0.2:8000")]
    new = [ep("prefill", "http://10.0.0.7:8000"), ep("prefill", "http://10.0.0.2:8000")]
    for e, name in zip(old + new, ["p-0", "p-1", "p-0", "p-1"], strict=True):
        e.name = name
    keys = [f"c{i}" for i in range(50)]
    assert [choose_prefill(old, "g1", affinity=k).name for k in keys] == [  # type: ignore[union-attr]
        choose_prefill(new, "g1", affinity=k).name for k in keys  # type: ignore[union-attr]
    ]
