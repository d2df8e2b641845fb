"""Background streams: plain single-turn requests decoding all leg long, and their TPOT per window."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from pdx_bench.background import BackgroundSpec, BackgroundStreams, StreamRecord, read_streams, window_tpots
from pdx_bench.points import point_stats
from pdx_bench.sweep import Leg, LocalTarget, SweepConfig, background_notes, run_sweep
from pdx_bench.workload import WordCounter, WorkloadSpec

from .fakeserver import EXAMPLE, FakeRouter, FakeTopology, ThreadedFake, example_doc
from .test_decode_local_sweep import _args


def test_streams_record_every_chunk_and_restart_as_they_end() -> None:
    fake = FakeRouter(first_token_delay=0.005, token_delay=0.004)
    with ThreadedFake(fake) as served:
        streams = BackgroundStreams(
            served.url, "m", BackgroundSpec(streams=2, prompt_tokens=12, output_tokens=6), WordCounter(),
            leg="dp", label="t",
        )  # fmt: skip
        assert streams.start(wait_s=10)
        time.sleep(0.4)
        records = streams.stop()
    assert {r.stream for r in records} == {0, 1}
    done = [r for r in records if r.complete]
    assert len(done) >= 4  # each stream ran more than one request in 0.4 s
    for rec in done:
        assert len(rec.chunk_times_ms) == rec.output_num_tokens == 6 and rec.reuse == "miss"
        assert rec.start_time_ms < rec.chunk_times_ms[0] and rec.chunk_times_ms == sorted(rec.chunk_times_ms)
        # On the client's clock, no sooner than the fake can send: 5 ms to the first token, 4 ms between.
        assert rec.chunk_times_ms[-1] - rec.start_time_ms >= 5 + 5 * 4
    # Plain P/D: one user message, no id anywhere, a fixed answer length, a prompt of its own each.
    for body, headers in zip(fake.bodies, fake.headers, strict=True):
        assert [m["role"] for m in body["messages"]] == ["user"]
        assert "conversation_id" not in body and "X-Session-ID" not in headers
        assert body["max_tokens"] == body["min_tokens"] == 6 and body["stream"] is True
    prompts = [b["messages"][0]["content"] for b in fake.bodies]
    assert len(set(prompts)) == len(prompts)


def test_a_refusing_router_fails_the_streams_without_hammering_it() -> None:
    fake = FakeRouter(first_token_delay=0.0, token_delay=0.0, fail_turn=1)
    with ThreadedFake(fake) as served:
        streams = BackgroundStreams(served.url, "m", BackgroundSpec(streams=2), WordCounter(), leg="dp", label="t")
        assert not streams.start(wait_s=0.3)
        records = streams.stop()
    assert all(r.http_status == 500 and not r.complete for r in records)
    assert len(records) <= 2 * 2  # a second apart
    [note] = background_notes("dp", records)
    assert note.startswith(f"background: {len(records)} of the dp leg's {len(records)} stream requests failed")


def _stream(times: list[float], output_tokens: int | None = None) -> StreamRecord:
    return StreamRecord(
        stream=0, request=0, leg="x", start_time_ms=times[0] - 5, chunk_times_ms=times,
        output_num_tokens=output_tokens, complete=output_tokens is not None,
    )  # fmt: skip


def test_tpot_in_a_window_is_the_mean_of_the_gaps_that_ended_in_it() -> None:
    stalled = _stream([0, 10, 20, 30, 40, 50, 150, 160, 170])  # a 100 ms stall ending at 150
    short = _stream([100, 110, 120])  # two gaps in the window: too few for a TPOT of its own
    tpots, gaps = window_tpots([stalled, short], [(35, 165)])
    assert tpots == [pytest.approx((10 + 10 + 100 + 10) / 4)]
    assert sorted(gaps) == [10, 10, 10, 10, 10, 100]


def test_chunks_of_several_tokens_are_read_per_token() -> None:
    packed = _stream([0, 8, 16, 24, 32, 40], output_tokens=12)  # two tokens a chunk
    tpots, gaps = window_tpots([packed], [(0, 40)])
    assert tpots == [pytest.approx(4.0)] and set(gaps) == {4.0}


def test_each_window_gives_each_stream_request_its_own_tpot() -> None:
    a, b = _stream([0, 10, 20, 30, 40, 50, 60, 70, 80, 90]), _stream([0, 5, 10, 15, 20, 25, 30, 35, 40, 45])
    tpots, _ = window_tpots([a, b], [(0, 40), (50, 90)])
    assert sorted(tpots) == [pytest.approx(5.0), pytest.approx(10.0), pytest.approx(10.0)]  # b ended at 45


def test_a_local_turn_that_stalls_decode_shows_in_the_streams_tpot_during_its_turns() -> None:
    FakeTopology.token_delay, FakeTopology.local_stall_s = 0.002, 0.06
    spec = WorkloadSpec(turns=2, conversations=2, user_tokens=4, tool_tokens=4, output_tokens=8)
    cfg = SweepConfig(
        lengths=[30], spec=spec, bound=False, suffixes=[8],
        legs=[Leg("dp", (("router.decodeLocalMaxTokens", 0),)), Leg("local", (("router.decodeLocalMaxTokens", 64),))],
        background=BackgroundSpec(streams=2, prompt_tokens=8, output_tokens=40),
    )  # fmt: skip
    results = run_sweep(LocalTarget(example_doc(), factory=FakeTopology), cfg, lambda ep: WordCounter())
    records = [r for leg in results for r in leg.records]
    streams = [s for leg in results for s in leg.background]
    # a request the leg's end cut before its answer began has no reuse header: only answered ones count
    answered = [s for s in streams if s.http_status]
    assert {s.leg for s in answered} == {"dp", "local"} and all(s.reuse == "miss" for s in answered)
    dp, local = point_stats(records, streams)
    assert (dp.outcomes, local.outcomes) == ({"hit": 2}, {"local": 2})
    assert dp.tpot_n >= 2 and local.tpot_n >= 2
    assert local.tpot_p50 > dp.tpot_p50 and local.itl_p99 >= 0.8 * 60


def test_the_cli_writes_each_legs_streams_and_the_per_point_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pdx_bench.sweep._local_topology", FakeTopology)
    FakeTopology.token_delay = 0.002
    out = tmp_path / "out"
    args = _args(
        "-f", str(EXAMPLE), "--leg", "dp:router.decodeLocalMaxTokens=0",
        "--leg", "local:router.decodeLocalMaxTokens=64",
        "--lengths", "30", "--suffix-tokens", "8,16", "--turns", "2", "--conversations", "2", "--output-tokens", "16",
        "--background-streams", "2", "--background-output-tokens", "20", "--out", str(out), "--no-warmup",
    )  # fmt: skip
    assert args.run(args) == 0
    for leg in ("dp", "local"):
        streams = read_streams(out / f"background-{leg}.json")
        assert streams and {s.leg for s in streams} == {leg}
    summary = json.loads((out / "summary.json").read_text())
    assert [(p["leg"], p["suffix_tokens"]) for p in summary["points"]] == [
        ("dp", 8), ("dp", 16), ("local", 8), ("local", 16)
    ]  # fmt: skip
    assert all(p["tpot_n"] > 0 and p["tpot_p90"] > 0 for p in summary["points"])
    report = (out / "report.md").read_text()
    assert "## TTFT and background TPOT per leg and point" in report and "| local | 30 | 16 | - | 2 |" in report
    assert "## The slowest follow-ups per leg and point: where their time went (ms)" in report
    assert "**local leg**: the engines of the leg before" in report and "**background**: 2 streams" in report
    assert "OFF vs ON" not in report and not (out / "ttft_vs_prompt_length.png").exists()  # no such legs ran
