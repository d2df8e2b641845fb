"""The router benchmark's verdicts: medians of in-block figures, and an order that favours no row."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.support.scripts import load_script


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script("bench_router")


def block(bench: ModuleType, rep: int, conc: int, **cpu: tuple[float, float]) -> list[object]:
    return [bench.Row(rep, conc, name.replace("_", "-"), ms, added) for name, (ms, added) in cpu.items()]


def test_each_target_is_judged_on_the_median_of_its_blocks(bench: ModuleType) -> None:
    rows = [
        *block(bench, 0, 8, pdx=(2.0, 1.0), pdx_reuse=(2.2, 2.0), vllm_router=(1.8, 0.5)),
        *block(bench, 1, 8, pdx=(2.0, 0.0), pdx_reuse=(3.0, 1.0), vllm_router=(2.2, 0.5)),
        *block(bench, 2, 8, pdx=(2.0, 0.4), pdx_reuse=(2.4, 1.0), vllm_router=(2.1, 0.6)),
    ]
    lines = bench.verdicts(rows)
    plain = next(x for x in lines if "vllm-router's" in x and "CPU" in x)
    # pdx/vllm-router per block: 1.11, 0.91, 0.95 -> median 0.95, under 1
    assert "0.95x" in plain and plain.endswith(": holds")
    reuse = next(x for x in lines if "pdx-reuse" in x)
    # 1.1, 1.5, 1.2 -> median 1.2, under 1.25, though one block is above it
    assert "1.20x" in reuse and "1.50" in reuse and reuse.endswith(": holds")
    ttft = next(x for x in lines if "TTFT" in x)
    assert "-0.20 ms" in ttft and ttft.endswith(": holds")  # differences 0.5, -0.5, -0.2


def test_a_target_above_its_limit_in_most_blocks_does_not_hold(bench: ModuleType) -> None:
    rows = [row for r in range(3) for row in block(bench, r, 1, pdx=(4.0, 0.0), vllm_router=(3.5 + r / 10, 0.0))]
    (plain,) = (x for x in bench.verdicts(rows) if "CPU / vllm-router's" in x)
    assert plain.startswith("  conc  1") and plain.endswith(": does not hold")
    assert not any("TTFT" in x for x in bench.verdicts(rows))  # judged at concurrency 8 only


def test_every_second_rep_runs_the_routers_in_reverse_after_direct(bench: ModuleType) -> None:
    targets = [bench.Target(name, turn=None) for name in ("direct", "pdx", "pdx-reuse", "vllm-router")]
    assert [t.name for t in bench.in_order(targets, 0)] == ["direct", "pdx", "pdx-reuse", "vllm-router"]
    assert [t.name for t in bench.in_order(targets, 1)] == ["direct", "vllm-router", "pdx-reuse", "pdx"]
