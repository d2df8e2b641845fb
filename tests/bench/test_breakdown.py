"""Where ON's TTFT goes: engine figures from two scrapes, the hops' arithmetic, the tables."""

from __future__ import annotations

import pytest

from pdx_bench.breakdown import (
    ALL_TURNS,
    BREAKDOWN_HEADERS,
    FOLLOWUPS,
    Figure,
    breakdown,
    breakdown_rows,
    breakdowns,
    engine_rows,
    engines_json,
    role_figures,
)
from pdx_bench.enginemetrics import (
    COPIES,
    POST_TIME,
    QUEUE_TIME,
    TTFT,
    XFER_TIME,
    GroupEngines,
    Hist,
    Snapshot,
    accumulate,
    delta,
    parse_histograms,
    snapshot_delta,
)
from pdx_bench.records import RequestRecord

from .synth import record


def _scrape(ttft: tuple[float, float], queue: tuple[float, float], xfer: tuple[float, float] | None) -> str:
    """vLLM's exposition of three histograms, each split over two engines; (sum s, count)."""
    out = ["# TYPE vllm:num_requests_running gauge", 'vllm:num_requests_running{engine="0"} 3.0']
    hists = {TTFT: ttft, QUEUE_TIME: queue}
    if xfer is not None:
        hists[XFER_TIME] = xfer
    for name, (total, count) in hists.items():
        out.append(f"# TYPE {name} histogram")
        for engine in ("0", "1"):
            out += [
                f'{name}_bucket{{engine="{engine}",le="0.1",model_name="q"}} {count / 2}',
                f'{name}_count{{engine="{engine}",model_name="q"}} {count / 2}',
                f'{name}_sum{{engine="{engine}",model_name="q"}} {total / 2}',
            ]
    return "\n".join(out) + "\n"


BEFORE = _scrape(ttft=(1.0, 10), queue=(0.2, 10), xfer=(0.05, 5))
AFTER = _scrape(ttft=(1.5, 15), queue=(0.25, 15), xfer=(0.07, 9))


def _is(f: Figure, mean_ms: float | None, count: float | None) -> bool:
    """A figure's mean (to rounding) and count."""
    same_mean = f.mean_ms is None if mean_ms is None else f.mean_ms == pytest.approx(mean_ms)
    return same_mean and f.count == count


def test_histograms_are_summed_over_engines_and_only_the_named_are_read() -> None:
    h = parse_histograms(BEFORE)
    assert h == {TTFT: Hist(1.0, 10), QUEUE_TIME: Hist(0.2, 10), XFER_TIME: Hist(0.05, 5)}


def test_two_scrapes_give_the_mean_and_count_of_what_happened_between() -> None:
    figs = role_figures(delta(parse_histograms(AFTER), parse_histograms(BEFORE)))
    assert _is(figs["ttft"], 100.0, 5)  # 0.5 s over 5 requests
    assert _is(figs["queue"], 10.0, 5)
    assert _is(figs["xfer"], 5.0, 4)  # 20 ms over 4 transfers


def test_a_histogram_the_engine_does_not_export_stays_blank_never_zero() -> None:
    d = delta(parse_histograms(AFTER), parse_histograms(BEFORE))
    assert POST_TIME not in d
    figs = role_figures(d)
    assert figs["post"] == Figure(None, None) and figs["prefill"] == Figure(None, None)
    without_nixl = delta(parse_histograms(_scrape((2.0, 20), (0.3, 20), None)), parse_histograms(AFTER))
    assert role_figures(without_nixl)["xfer"] == Figure(None, None)


def test_nothing_observed_counts_zero_with_a_blank_mean() -> None:
    assert role_figures(delta(parse_histograms(BEFORE), parse_histograms(BEFORE)))["xfer"] == Figure(None, 0)


def test_an_engine_restarted_between_scrapes_reads_blank_not_negative() -> None:
    assert delta(parse_histograms(BEFORE), parse_histograms(AFTER)) == {}


def test_a_histogram_that_appears_between_scrapes_counts_from_zero() -> None:
    assert delta({TTFT: Hist(0.3, 2)}, {}) == {TTFT: Hist(0.3, 2)}


def test_a_role_that_could_not_be_scraped_is_blank_in_the_difference() -> None:
    d = snapshot_delta({"prefill": {TTFT: Hist(2, 2)}, "decode": None}, {"prefill": {TTFT: Hist(1, 1)}, "decode": {}})
    assert d == {"decode": None, "prefill": {TTFT: Hist(1, 1)}}


def test_followup_windows_add_up_and_a_hole_leaves_the_sum_blank() -> None:
    one: Snapshot = {"prefill": {TTFT: Hist(0.1, 1), XFER_TIME: Hist(0.01, 1)}, "decode": {TTFT: Hist(0.2, 1)}}
    two: Snapshot = {"prefill": {TTFT: Hist(0.3, 1)}, "decode": None}
    total = accumulate(accumulate(None, one), one)
    assert total == {"prefill": {TTFT: Hist(0.2, 2), XFER_TIME: Hist(0.02, 2)}, "decode": {TTFT: Hist(0.4, 2)}}
    assert accumulate(total, two) == {"prefill": {TTFT: Hist(0.5, 3)}, "decode": None}


def _group(prefill_ttft_s: float, decode_ttft_s: float, n: int, followups: bool = True) -> GroupEngines:
    snap: Snapshot = {
        "prefill": {TTFT: Hist(prefill_ttft_s * n, n), QUEUE_TIME: Hist(0.01 * n, n), XFER_TIME: Hist(0.02 * n, n)},
        "decode": {TTFT: Hist(decode_ttft_s * n, n), XFER_TIME: Hist(0.003 * n, n)},
    }
    return GroupEngines(all_turns=snap, followups=snap if followups else None)


def _on() -> list[RequestRecord]:
    # Follow-up turns: TTFT 100/120/140 ms, prefill hop 50/60/70 ms; turn 1 much slower.
    recs = [record("on", 1000, 1, 900.0, prefill=800.0, reuse="miss")]
    recs += [record("on", 1000, t, 60.0 + 20 * t, prefill=30.0 + 10 * t, reuse="hit") for t in (2, 3, 4)]
    return recs


def test_the_hops_are_split_into_engine_time_and_api_http() -> None:
    bound = [record("bound", 1000, 1, 700.0)] + [record("bound", 1000, t, 40.0 + 10 * t) for t in (2, 3, 4)]
    b = breakdown(1000, _on(), _group(0.045, 0.030, 3), bound, _group(0.0, 0.035, 3))
    assert b.scope == FOLLOWUPS and b.n == 3
    assert b.ttft_p50 == pytest.approx(120.0) and b.ttft_mean == pytest.approx(120.0)
    assert b.prefill_hop == pytest.approx(60.0)
    assert b.decode_hop == pytest.approx(60.0)  # TTFT - prefill hop
    assert b.prefill["ttft"].mean_ms == pytest.approx(45.0) and b.prefill["queue"].mean_ms == pytest.approx(10.0)
    assert _is(b.prefill["xfer"], 20.0, 3)
    assert b.prefill_api_ms == pytest.approx(15.0)  # 60 - 45
    assert b.decode["ttft"].mean_ms == pytest.approx(30.0) and b.decode["xfer"].mean_ms == pytest.approx(3.0)
    assert b.decode_api_ms == pytest.approx(30.0)  # 60 - 30
    assert b.bound_n == 3 and b.bound_p50 == pytest.approx(70.0)
    assert b.bound_decode is not None and b.bound_decode["ttft"].mean_ms == pytest.approx(35.0)
    assert b.bound_api_ms == pytest.approx(35.0)
    assert b.on_over_bound == pytest.approx(120 / 70)


def test_with_only_group_scrapes_the_router_figures_cover_all_turns_too() -> None:
    b = breakdown(1000, _on(), _group(0.2, 0.1, 4, followups=False))
    assert b.scope == ALL_TURNS and b.n == 4
    assert b.ttft_mean == pytest.approx((900 + 120 * 3) / 4) and b.prefill_hop == pytest.approx((800 + 180) / 4)


def test_without_engine_metrics_the_router_figures_stand_alone() -> None:
    b = breakdown(1000, _on(), None)
    assert b.scope == FOLLOWUPS and b.prefill_hop == pytest.approx(60.0)
    assert b.prefill["ttft"] == Figure(None, None) and b.prefill_api_ms is None
    assert b.bound_p50 is None and b.bound_decode is None and b.on_over_bound is None
    row = dict(zip(BREAKDOWN_HEADERS, breakdown_rows([b])[0], strict=True))
    assert row["prefill hop"] == "60.0" and row["P engine TTFT"] == "-" and row["P API+HTTP"] == "-"
    assert row["bound p50"] == "-" and row["ON/bound"] == "-"


def test_without_reuse_headers_the_hops_are_blank() -> None:
    recs = [record("on", 1000, t, 100.0) for t in (2, 3)]
    b = breakdown(1000, recs, _group(0.045, 0.030, 2))
    assert b.prefill_hop is None and b.decode_hop is None and b.prefill_api_ms is None
    assert b.prefill["ttft"].mean_ms == pytest.approx(45.0)


def test_report_rows_per_length_and_per_role() -> None:
    recs = [*_on(), record("on", 4000, 2, 300.0, prefill=200.0)]
    engines = {"on": {1000: _group(0.045, 0.030, 3)}, "off": {1000: _group(0.3, 0.03, 3)}}
    rows = breakdowns(recs, engines)
    assert [b.length for b in rows] == [1000, 4000]
    cells = dict(zip(BREAKDOWN_HEADERS, breakdown_rows(rows)[0], strict=True))
    assert cells["TTFT p50"] == "120.0" and cells["P engine TTFT"] == "45.0" and cells["D->P xfer"] == "20.0"
    assert cells["D->P post"] == "-"  # not exported: blank
    assert cells["decode hop"] == "60.0" and cells["D API+HTTP"] == "30.0"
    assert dict(zip(BREAKDOWN_HEADERS, breakdown_rows(rows)[1], strict=True))["P engine TTFT"] == "-"  # none for 4000
    on_prefill = engines["on"][1000].followups["prefill"]  # type: ignore[index]
    assert on_prefill is not None
    on_prefill[COPIES] = Hist(36.0, 3)
    per_role = engine_rows(engines)
    assert ("on", "1000", FOLLOWUPS, "decode", "30.0 (3)", "-", "-", "3.0 (3)", "-", "-") in per_role
    assert ("on", "1000", FOLLOWUPS, "prefill", "45.0 (3)", "10.0 (3)", "-", "20.0 (3)", "-", "12.0 (3)") in per_role
    assert ("off", "1000", FOLLOWUPS, "prefill", "300.0 (3)", "10.0 (3)", "-", "20.0 (3)", "-", "-") in per_role
    as_json = engines_json(engines)["on"]["1000"]
    assert as_json[FOLLOWUPS]["decode"]["post"] == {"mean_ms": None, "count": None}
    assert as_json[FOLLOWUPS]["prefill"]["copies"] == {"mean": pytest.approx(12.0), "count": 3}
    assert as_json[FOLLOWUPS]["decode"]["copies"] == {"mean": None, "count": None}
    assert as_json[ALL_TURNS]["prefill"]["ttft"] == {"mean_ms": pytest.approx(45.0), "count": 3}
    j = rows[0].to_json()
    assert j["prefill_api_http_ms"] == pytest.approx(15.0) and j["bound"]["ttft_p50_ms"] is None


def _split_group(n_prefill: int, n_local: int) -> GroupEngines:
    """Per-request windows summed per path: prefill saw only the prefill path's turns (45 ms each);
    decode served both, its engine TTFT 30 ms for a P->D turn and 12 ms for a local one."""
    via: Snapshot = {
        "prefill": {TTFT: Hist(0.045 * n_prefill, n_prefill)},
        "decode": {TTFT: Hist(0.030 * n_prefill, n_prefill)},
    }
    local: Snapshot = {"prefill": {TTFT: Hist(0.0, 0)}, "decode": {TTFT: Hist(0.012 * n_local, n_local)}}
    whole = accumulate(accumulate(None, via), local)
    return GroupEngines(all_turns=whole, followups=whole, followups_by_path={"prefill": via, "local": local})


def _mixed() -> list[RequestRecord]:
    """Turn 1 through prefill; then two D->P turns (prefill hop 60 ms) and two local ones (the router
    reports a 0 ms prefill hop for a turn prefilled on decode)."""
    recs = [record("on", 1000, 1, 900.0, prefill=800.0, reuse="miss")]
    recs += [record("on", 1000, t, 100.0, prefill=60.0, reuse="hit") for t in (2, 3)]
    recs += [record("on", 1000, t, 20.0, prefill=0.0, reuse="local") for t in (4, 5)]
    return recs


def test_turns_of_the_two_paths_get_a_row_each_every_figure_from_that_rows_turns() -> None:
    rows = breakdowns(_mixed(), {"on": {1000: _split_group(2, 2)}})
    assert [(b.path, b.n) for b in rows] == [("prefill", 2), ("local", 2)]
    via, local = rows
    assert via.prefill_hop == pytest.approx(60.0) and via.prefill["ttft"].mean_ms == pytest.approx(45.0)
    assert via.prefill_api_ms == pytest.approx(15.0)  # 60 - 45: the local turns' 0 ms hops stay out
    assert via.decode_hop == pytest.approx(40.0) and via.decode_api_ms == pytest.approx(10.0)  # 40 - 30
    assert local.prefill_hop is None and local.prefill["ttft"] == Figure(None, None)  # prefill never saw them
    assert local.decode_hop == pytest.approx(20.0) and local.decode["ttft"].mean_ms == pytest.approx(12.0)
    assert local.decode_api_ms == pytest.approx(8.0)
    cells = dict(zip(BREAKDOWN_HEADERS, breakdown_rows(rows)[1], strict=True))
    assert cells["path"] == "local" and cells["prefill hop"] == "-" and cells["P API+HTTP"] == "-"


def test_an_all_turns_row_never_reads_one_populations_hop_against_anothers_engine() -> None:
    """Issue 43: under load, first turns through prefill and decode-local follow-ups in one group
    scrape printed P API+HTTP = -3,335 ms: the prefill hop averaged over every turn (0 for local
    ones) against prefill's engine TTFT of the first turns alone."""
    recs = [record("on", 16000, 1, 5000.0, prefill=4400.0, reuse="miss") for _ in range(4)]
    recs += [record("on", 16000, t, 70.0, prefill=0.0, reuse="local") for t in (2, 3, 4) for _ in range(4)]
    group: Snapshot = {"prefill": {TTFT: Hist(4.3 * 4, 4)}, "decode": {TTFT: Hist(0.5 * 16, 16)}}
    rows = breakdowns(recs, {"on": {16000: GroupEngines(all_turns=group)}})
    assert [(b.scope, b.path, b.n) for b in rows] == [(ALL_TURNS, "prefill", 4), (ALL_TURNS, "local", 12)]
    via, local = rows
    assert via.prefill_hop == pytest.approx(4400.0) and via.prefill_api_ms == pytest.approx(100.0)
    # decode's window mixes both paths: blank in both rows rather than read against either
    assert via.decode["ttft"] == Figure(None, None) and local.decode["ttft"] == Figure(None, None)
    assert via.decode_api_ms is None and local.decode_api_ms is None
    for b in rows:
        assert b.prefill_api_ms is None or b.prefill_api_ms >= 0


def test_the_bound_of_a_path_is_the_bound_of_that_paths_own_turns() -> None:
    bound = [record("bound", 1000, t, 10.0 * t) for t in (1, 2, 3, 4, 5)]
    rows = breakdowns([*_mixed(), *bound], {"on": {1000: _split_group(2, 2)}})
    assert [(b.path, b.bound_n, b.bound_p50) for b in rows] == [("prefill", 2, 25.0), ("local", 2, 45.0)]
