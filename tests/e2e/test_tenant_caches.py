"""Tenants apart inside the engines, on real vLLM CPU engines (issue 44): with the router's default
cacheIsolation (a cache_salt per tenant), a tenant that sends another tenant's exact history finds
none of it in any engine's prefix cache, while the owner, asking right after the probe, still finds
it: the salt, not an eviction, kept them apart. And the same probe, timed, cannot be told from an
unknown history by its TTFT, while the owner's own hits can (the cross-tenant timing probe).

Prefill's prefix cache is on here (the `production` profile's default; the local CR's `benchmark`
profile turns it off), so a hit skips prefill's compute and shows in TTFT, not only in a shorter
KV transfer to decode. The engines' tokenize cache is on, as rendered: its keys start from the
request's cache_salt too, so a probe of another tenant's text tokenizes it whole."""

from __future__ import annotations

import copy
import random
import statistics
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from pdx.local import default_document
from pdx.local.topology import LocalTopology
from tests.e2e.chat import chat, metric

pytest.importorskip("vllm", reason="needs the engine extra (scripts/setup.sh)")
pytestmark = [pytest.mark.engines, pytest.mark.timeout(900)]

HITS = "vllm:prefix_cache_hits_total"
HISTORY = [
    {"role": "system", "content": "You audit plant logs."},
    {"role": "user", "content": " ".join(f"Log {i}: line {i % 9} pressure {i * 17 % 83} kPa." for i in range(90))},
]
# The timing probe: TRIALS of each group, a fresh pair of histories per trial (a probe sent once
# would warm the prober's own cache), compared by an exact two-sided rank-sum (Mann-Whitney U)
# test at ALPHA. With 12 against 12, fully separated samples give p = 2 / C(24, 12) = 7.4e-7, so
# the owner's hits must come out different; ALPHA is the chance that two samples of one
# distribution (in random order within each trial) fail the test anyway.
TRIALS, ALPHA = 12, 0.001
PROBE_UNITS = 300  # ~2.8k prompt tokens: a miss prefills ~400 ms on this CPU, a hit ~60 ms


@pytest.fixture(scope="module")
def topo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTopology]:
    doc: dict[str, Any] = copy.deepcopy(default_document())
    doc["spec"]["router"]["tenancy"] = {"identity": "apiKey"}  # the default cacheIsolation: tenant
    doc["spec"]["prefill"]["prefixCaching"] = True
    with LocalTopology(doc, state_dir=tmp_path_factory.mktemp("tenants")) as t:
        yield t


def hits(topo: LocalTopology) -> float:
    return sum(metric(url, HITS) for role in ("prefill", "decode") for url in topo.engine_urls[role])


def test_another_tenants_exact_history_finds_nothing_cached_while_its_owner_does(topo: LocalTopology) -> None:
    router = topo.router_url
    chat(router, HISTORY, conversation=None, api_key="tenant-a")
    before = hits(topo)
    chat(router, HISTORY, conversation=None, api_key="tenant-b")  # the probe: a's exact history
    probe = hits(topo) - before
    before = hits(topo)
    chat(router, HISTORY, conversation=None, api_key="tenant-a")
    owner = hits(topo) - before
    assert probe == 0, f"tenant b found {probe:g} tokens of tenant a's history in the engines' caches"
    assert owner >= 512, f"tenant a found only {owner:g} tokens of its own history"


def _midranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def rank_sum_p(x: list[float], y: list[float]) -> float:
    """Exact two-sided p of the rank-sum (Mann-Whitney U) test, ties as midranks: the share of
    all splits of the pooled ranks into len(x) and len(y) whose x rank sum lies at least as far
    from its mean as the observed one."""
    doubled = [round(2 * r) for r in _midranks(x + y)]  # midranks are halves: whole numbers doubled
    ways: list[Counter[int]] = [Counter() for _ in range(len(x) + 1)]  # ways[k][s]: k ranks summing to s
    ways[0][0] = 1
    for r in doubled:
        for k in range(len(x), 0, -1):
            for s, n in ways[k - 1].items():
                ways[k][s + r] += n
    mean2 = len(x) * sum(doubled)  # twice the split's mean sum, times len(x + y), kept whole
    far = abs(sum(doubled[: len(x)]) * len(doubled) - mean2)
    splits = ways[len(x)]
    return sum(n for s, n in splits.items() if abs(s * len(doubled) - mean2) >= far) / sum(splits.values())


def test_rank_sum_p_is_exact() -> None:
    assert rank_sum_p([1, 2, 3], [4, 5, 6]) == pytest.approx(2 / 20)
    assert rank_sum_p([4, 5, 6], [1, 2, 3]) == pytest.approx(2 / 20)
    assert rank_sum_p([1.0] * 12, [1.0] * 12) == 1.0
    assert rank_sum_p([1, 4], [2, 3]) == 1.0  # rank sums 5 and 5: the mean
    assert rank_sum_p([float(v) for v in range(12)], [v + 100.0 for v in range(12)]) == pytest.approx(2 / 2704156)


def _history(rng: random.Random, tag: str) -> list[dict[str, str]]:
    """A history of ~2.8k tokens whose first tokens are its own (no block shared with any other)."""
    words = " ".join(f"R{rng.randrange(10**6)} v{rng.randrange(999)}." for _ in range(PROBE_UNITS))
    return [{"role": "system", "content": f"{tag} audit {words}"}, {"role": "user", "content": "Summarize."}]


def test_another_tenants_exact_history_is_timed_as_an_unknown_one_while_the_owners_hits_show(
    topo: LocalTopology,
) -> None:
    """Each trial: tenant a sends a fresh history; then, in a random order, tenant b sends that
    history (probe), tenant b sends another fresh history of the same shape (unknown) and tenant a
    sends its history again (owner). Which of the trial's two fresh histories a sends is drawn
    too. Interleaved so, drift on a shared 2-core machine (30-40% within minutes) hits all three
    groups alike. Then: probe against unknown not different at ALPHA (two-sided exact rank-sum),
    owner against unknown different at ALPHA, which shows the test can fail."""
    router, rng = topo.router_url, random.Random(44)
    for i in range(2):  # the engines' first requests are slow
        chat(router, _history(rng, f"w{i}"), conversation=None, max_tokens=4, api_key="tenant-a")
    ttft: dict[str, list[float]] = {"probe": [], "unknown": [], "owner": []}
    found: dict[str, float] = {"probe": 0.0, "unknown": 0.0, "owner": 0.0}
    for i in range(TRIALS):
        known, unknown = _history(rng, f"x{i}"), _history(rng, f"y{i}")
        if rng.random() < 0.5:
            known, unknown = unknown, known
        chat(router, known, conversation=None, max_tokens=4, api_key="tenant-a")
        sends = {"probe": (known, "tenant-b"), "unknown": (unknown, "tenant-b"), "owner": (known, "tenant-a")}
        order = list(sends)
        rng.shuffle(order)
        for group in order:
            messages, key = sends[group]
            before = hits(topo)
            answer = chat(router, messages, conversation=None, max_tokens=4, api_key=key)
            found[group] += hits(topo) - before
            assert answer.ttft_ms > 0, f"{group}: no content streamed"
            ttft[group].append(answer.ttft_ms)
    med = {g: statistics.median(v) for g, v in ttft.items()}
    p_probe, p_owner = rank_sum_p(ttft["probe"], ttft["unknown"]), rank_sum_p(ttft["owner"], ttft["unknown"])
    seen = (
        f"TTFT medians ms: probe {med['probe']:.0f}, unknown {med['unknown']:.0f}, owner {med['owner']:.0f}; "
        f"p probe/unknown {p_probe:.3g}, owner/unknown {p_owner:.3g}; cached tokens found: "
        + ", ".join(f"{g} {n:g}" for g, n in found.items())
    )
    print(seen)
    assert p_probe > ALPHA, f"tenant b's probe of tenant a's history is timed apart from an unknown one: {seen}"
    assert p_owner < ALPHA, f"the owner's hits were not told apart, so the test could not have failed: {seen}"
    assert found["probe"] == 0 and found["unknown"] == 0, seen
    assert found["owner"] >= TRIALS * 1024, seen
