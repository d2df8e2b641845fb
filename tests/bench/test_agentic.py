"""The agentic mix (`--suffix-mix`, issue 43): follow-up suffixes drawn from a stated distribution,
the same for OFF, ON and the bound, and the report's outcome mix and ON/bound per suffix bucket."""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from pathlib import Path

import pytest

from pdx_bench import agentic, cli
from pdx_bench.records import read_records
from pdx_bench.workload import AGENTIC, SuffixBucket, SuffixMix, WordCounter, WorkloadSpec, build, turn_suffixes

from .fakeserver import EXAMPLE, FakeTopology
from .synth import record


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    cli.add_parser(sub)
    return p.parse_args(["bench", *argv])


def test_the_agentic_mix_is_mostly_short_with_a_long_tail_to_8k() -> None:
    rng = random.Random(7)
    draws = [AGENTIC.draw(rng) for _ in range(20000)]
    assert min(draws) >= 100 and max(draws) < 8192
    share = Counter(AGENTIC.bucket_of(n).label for n in draws)  # type: ignore[union-attr]
    total = sum(b.weight for b in AGENTIC.buckets)
    for b in AGENTIC.buckets:  # each bucket drawn as often as its weight says, within 1.5 points
        assert share[b.label] / len(draws) == pytest.approx(b.weight / total, abs=0.015)
    assert sorted(draws)[len(draws) // 2] < 1024  # most turns stay under the GPU's decode-local threshold
    # log-uniform within a bucket: as many draws below its geometric middle as above
    tail = [n for n in draws if n >= 4096]
    assert abs(sum(1 for n in tail if n < (4096 * 8192) ** 0.5) / len(tail) - 0.5) < 0.05


def test_a_mix_is_parsed_from_its_name_or_its_buckets_and_bad_ones_are_refused() -> None:
    assert SuffixMix.parse("agentic") is AGENTIC
    mix = SuffixMix.parse("100-500:3, 500-2000:1")
    assert mix.buckets == (SuffixBucket(100, 500, 3.0), SuffixBucket(500, 2000, 1.0))
    assert mix.describe().startswith("100-500:3, 500-2000:1: 100-500 75%, 500-2000 25%")
    for bad in ("100:1", "100-50:1", "100-500:0", "100-500:1,400-900:1", "x-y:1", "agentik"):
        with pytest.raises(ValueError):
            SuffixMix.parse(bad)


def test_each_follow_up_turn_gets_its_own_draw_the_same_in_every_leg_and_the_bound() -> None:
    spec = WorkloadSpec(prefix_tokens=300, turns=5, conversations=3, user_tokens=20, suffix_mix=AGENTIC, seed=3)
    on = build(spec, WordCounter(), label="on")
    bound = build(WorkloadSpec(**{**spec.__dict__, "text_salt": ":bound"}), WordCounter(), label="bound")
    for c, (a, b) in enumerate(zip(on.conversations, bound.conversations, strict=True)):
        sizes = [t.new_tokens for t in a.turns]
        assert sizes[0] is None and sizes[1:] == turn_suffixes(3, 300, c, 5, AGENTIC)
        assert sizes == [t.new_tokens for t in b.turns]  # same sizes, other words
        assert [t.content for t in a.turns[1:]] != [t.content for t in b.turns[1:]]
        for turn in a.turns[1:]:  # a tool result, then an instruction of at most user_tokens and half
            assert turn.tokens == turn.new_tokens
    other_seed = build(WorkloadSpec(**{**spec.__dict__, "seed": 4}), WordCounter(), label="on")
    assert [t.new_tokens for t in other_seed.conversations[0].turns] != [
        t.new_tokens for t in on.conversations[0].turns
    ]


def test_the_max_model_len_check_adds_up_the_longest_conversations_draws() -> None:
    spec = WorkloadSpec(prefix_tokens=1000, turns=4, conversations=5, suffix_mix=AGENTIC, seed=0)
    longest = max(sum(turn_suffixes(0, 1000, c, 4, AGENTIC)) for c in range(5))
    assert longest + 1000 < spec.last_turn_tokens() < longest + 1000 + 400
    assert cli.max_prompt_tokens(spec, [1000, 2000], []) >= spec.with_prefix(2000).last_turn_tokens()


def test_bucket_rows_count_outcomes_per_class_and_put_off_and_the_bound_beside_on() -> None:
    mix = SuffixMix.parse("10-100:1,100-1000:1")
    recs = []
    for leg, ttft, reuse in (("on", 20.0, "local"), ("off", 200.0, "miss"), ("bound", 10.0, None)):
        recs += [record(leg, 1000, t, ttft + t, reuse=reuse) for t in (2, 3)]
    for leg, ttft, reuse in (("on", 80.0, "hit"), ("off", 400.0, "miss"), ("bound", 50.0, None)):
        recs += [record(leg, 1000, t, ttft, reuse=reuse) for t in (4, 5)]
    recs.append(record("on", 1000, 6, 300.0, reuse="released"))
    recs.append(record("on", 1000, 1, 900.0, reuse="miss"))  # a first turn: no suffix, no row
    for r in recs:
        r.suffix_mix = "m"
        r.suffix_tokens = None if r.turn == 1 else (50 if r.turn < 4 else 500)
    rows = {(r.leg, r.bucket): r for r in agentic.bucket_rows(recs, mix)}
    assert list(rows) == [("on", "10-100"), ("on", "100-1000"), ("on", "all")]
    short, long_, every = rows["on", "10-100"], rows["on", "100-1000"], rows["on", "all"]
    assert short.n == 2 and short.outcomes == {"local": 2, "D->P": 0, "recompute": 0, "released": 0}
    assert short.ttft_p50 == pytest.approx(22.5) and short.bound_p50 == pytest.approx(12.5)
    assert short.on_over_bound == pytest.approx(22.5 / 12.5) and short.off_over_on == pytest.approx(202.5 / 22.5)
    assert long_.outcomes == {"local": 0, "D->P": 2, "recompute": 0, "released": 1} and long_.n == 3
    assert every.n == 5 and every.outcomes["local"] == 2 and every.bound_n == 4
    cells = dict(zip(agentic.HEADERS, agentic.table_rows([long_])[0], strict=True))
    assert cells["D->P"] == "2 (67%)" and cells["released"] == "1 (33%)" and cells["local"] == "0"
    assert agentic.to_json([long_], mix)["rows"][0]["outcomes"]["D->P"] == 2  # type: ignore[index]


def test_the_cli_runs_a_mix_and_reports_outcomes_and_on_over_bound_per_bucket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the fakes, decode-local up to 64 new tokens (the fake counts words + 4): the short bucket goes
    local, the long one reads decode's KV through prefill."""
    monkeypatch.setattr("pdx_bench.sweep._local_topology", FakeTopology)
    out = tmp_path / "out"
    args = _args(
        "-f", str(EXAMPLE), "--local", "--lengths", "200", "--turns", "4", "--conversations", "4",
        "--user-tokens", "8", "--output-tokens", "3", "--suffix-mix", "20-56:1,80-300:1",
        "--set", "router.decodeLocalMaxTokens=64", "--out", str(out),
    )  # fmt: skip
    assert args.run(args) == 0
    printed = capsys.readouterr().out
    assert "Agentic mix, TTFT in ms per suffix bucket" in printed
    recs = {leg: read_records(out / f"records-{leg}.json") for leg in ("off", "on", "bound")}
    sizes = {leg: sorted((r.conversation_id[-2:], r.turn, r.suffix_tokens) for r in rs) for leg, rs in recs.items()}
    assert sizes["off"] == sizes["on"] == sizes["bound"]  # the same draws in every leg
    assert all(r.suffix_mix == "20-56:1,80-300:1" for rs in recs.values() for r in rs)
    on = [r for r in recs["on"] if r.turn >= 2]
    assert {r.reuse for r in on if r.suffix_tokens is not None and r.suffix_tokens < 56} == {"local"}
    assert {r.reuse for r in on if r.suffix_tokens is not None and r.suffix_tokens >= 80} == {"hit"}
    summary = json.loads((out / "summary.json").read_text())
    rows = {r["bucket"]: r for r in summary["agentic"]["rows"] if r["leg"] == "on"}
    assert set(rows) == {"20-56", "80-300", "all"}
    assert rows["all"]["n"] == 12 == rows["20-56"]["n"] + rows["80-300"]["n"]
    assert rows["20-56"]["outcomes"]["local"] == rows["20-56"]["n"]
    assert rows["80-300"]["outcomes"]["D->P"] == rows["80-300"]["n"]
    for row in rows.values():
        assert row["bound_n"] == row["n"] == row["off_n"] and row["on_over_bound"] is not None
    report = (out / "report.md").read_text()
    assert "## Agentic mix: outcomes and ON/bound per suffix bucket" in report
    assert "suffix mix**: 20-56:1,80-300:1: 20-56 50%, 80-300 50%" in report
    paths = {(b["path"], b["n"]) for b in summary["ttft_breakdown"]}
    assert paths == {("prefill", rows["80-300"]["n"]), ("local", rows["20-56"]["n"])}


def test_a_mix_and_suffix_points_together_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = _args(
        "-f", str(EXAMPLE), "--local", "--suffix-mix", "agentic", "--suffix-tokens", "128", "--out", str(tmp_path)
    )
    assert args.run(args) == 2
    assert "not both" in capsys.readouterr().err
