"""The bound: ON's workload sent whole straight to the decode engine, in the same run."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import pytest

from pdx.local.topology import free_port
from pdx_bench import cli
from pdx_bench.records import read_records
from pdx_bench.sweep import BOUND_SALT, LocalTarget, SweepConfig, run_sweep, total_requests
from pdx_bench.workload import WordCounter, WorkloadSpec, build

from .fakeserver import EXAMPLE, FakeEngine, FakeRouter, FakeTopology, ThreadedFake, example_doc

SPEC = WorkloadSpec(turns=3, conversations=2, user_tokens=5, tool_tokens=5, output_tokens=3)
WORKLOAD = ("--turns", "3", "--conversations", "2", "--user-tokens", "5", "--tool-tokens", "5", "--output-tokens", "3")


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    cli.add_parser(p.add_subparsers())
    return p.parse_args(["bench", *argv])


def test_the_bound_sends_ons_workload_whole_to_decode_without_router_fields() -> None:
    cfg = SweepConfig(lengths=[100, 400], spec=SPEC, legs=[True])
    done: list[object] = []
    results = run_sweep(LocalTarget(example_doc(), factory=FakeTopology), cfg, lambda ep: WordCounter(), done.append)
    on, bound = results
    assert [r.leg for r in results] == ["on", "bound"] and bound.errors == []
    assert len(done) == total_requests(cfg) == 2 * 2 * 2 * 3
    # Same shape: lengths, conversations, turns, prompt sizes; its own conversation ids.
    shape = sorted((r.prefix_tokens, r.turn, r.input_num_tokens) for r in on.records)
    assert sorted((r.prefix_tokens, r.turn, r.input_num_tokens) for r in bound.records) == shape
    assert {r.conversation_id for r in on.records}.isdisjoint({r.conversation_id for r in bound.records})
    assert {r.leg for r in bound.records} == {"bound"}
    # No router: no reuse facts, no D->P transfer attributed to its records.
    assert {(r.reuse, r.prefill_ms, r.kv_transfer_ms, r.kv_transfer_source) for r in bound.records} == {
        (None, None, None, None)
    }
    (decode,) = FakeTopology.decodes
    assert len(decode.bodies) == len(bound.records)
    for body, headers in zip(decode.bodies, decode.headers, strict=True):
        # A plain request: decode (kv_consumer) serves it from its own prefix cache.
        assert "conversation_id" not in body and "kv_transfer_params" not in body
        assert "X-Session-ID" not in headers
        assert body["model"] == "pdx-tiny" and body["stream"] is True
    # Each turn re-sends the history it answered the turn before.
    turn3 = [b for b in decode.bodies if len(b["messages"]) == 6]
    assert turn3 and all(
        m["content"].startswith(" e") for b in turn3 for m in b["messages"] if m["role"] == "assistant"
    )
    # Another system prompt than ON's: decode caches ON's prompts, and a prefix cache matches from
    # the first token on, so none of ON's blocks can stand in for the bound's own suffix.
    (router,) = FakeTopology.routers
    assert {b["messages"][0]["content"] for b in router.bodies}.isdisjoint(
        {b["messages"][0]["content"] for b in decode.bodies}
    )
    assert bound.engines[100].followups is not None and bound.engines[100].followups["decode"] is not None


def test_bound_texts_are_other_words_of_the_same_sizes() -> None:
    plain, salted = build(SPEC.with_prefix(200)), build(replace(SPEC.with_prefix(200), text_salt=BOUND_SALT))
    for a, b in zip(plain.conversations, salted.conversations, strict=True):
        assert a.system != b.system and a.turns[1].content != b.turns[1].content
        assert [t.tokens for t in a.turns] == [t.tokens for t in b.turns]
        assert WordCounter().count(a.system or "") == WordCounter().count(b.system or "")


def test_the_cli_writes_the_bound_and_where_ons_ttft_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("pdx_bench.sweep._local_topology", FakeTopology)
    out = tmp_path / "out"
    args = _args("-f", str(EXAMPLE), "--local", "--lengths", "200,800", *WORKLOAD, "--out", str(out), "--no-warmup")
    assert args.run(args) == 0
    printed = capsys.readouterr().out
    assert "ON/bound" in printed and "Where ON's TTFT goes" in printed
    bound = read_records(out / "records-bound.json")
    assert len(bound) == 2 * 2 * 3 and {r.leg for r in bound} == {"bound"}
    summary = json.loads((out / "summary.json").read_text())
    row = summary["rows"][1]
    assert row["bound"]["n"] == 4 and row["on_over_bound"] == pytest.approx(
        row["on"]["ttft_p50"] / row["bound"]["ttft_p50"]
    )
    assert "bound" not in summary["router_stats"]
    where = summary["ttft_breakdown"][0]
    assert where["length"] == 200 and where["scope"] == "turns >= 2" and where["n"] == 4
    # The fakes' books: prefill 10 ms TTFT, 3 queue, 6 prefill, D->P read 4 + post 1 on every hit;
    # decode 8 ms TTFT, its P->D read 2; decode alone (the bound) 7 ms.
    assert where["prefill_hop_ms"] == pytest.approx(12.5)  # X-PDX-Prefill-Ms of a hit
    assert where["router_ms"] == pytest.approx(1.5)  # X-PDX-Router-Ms of a hit: its claim
    engine = where["prefill_engine"]
    assert engine["ttft"] == {"mean_ms": pytest.approx(10.0), "count": 4}
    assert engine["queue"]["mean_ms"] == pytest.approx(3.0) and engine["prefill"]["mean_ms"] == pytest.approx(6.0)
    assert engine["xfer"] == {"mean_ms": pytest.approx(4.0), "count": 4}
    assert engine["post"]["mean_ms"] == pytest.approx(1.0)
    assert where["prefill_api_http_ms"] == pytest.approx(2.5)
    assert where["decode_engine"]["ttft"]["mean_ms"] == pytest.approx(8.0)
    assert where["decode_engine"]["xfer"]["mean_ms"] == pytest.approx(2.0)
    assert where["decode_hop_ms"] == pytest.approx(where["ttft_mean_ms"] - 1.5 - 12.5)
    assert where["decode_api_http_ms"] == pytest.approx(where["decode_hop_ms"] - 8.0)
    assert where["bound"]["n"] == 4 and where["bound"]["decode_engine"]["ttft"]["mean_ms"] == pytest.approx(7.0)
    assert where["on_over_bound"] == pytest.approx(where["ttft_p50_ms"] / where["bound"]["ttft_p50_ms"])
    # The engines' figures per leg, length and role, both windows; OFF reads no transfer of its own.
    off = summary["engines"]["off"]["200"]
    assert (
        off["turns >= 2"]["prefill"]["xfer"]["count"] == 0 and off["turns >= 2"]["prefill"]["xfer"]["mean_ms"] is None
    )
    assert off["all turns"]["prefill"]["ttft"]["count"] == 6
    # First turns of both legs, scraped around each: 2 conversations, decode's own 8 ms inside its hop.
    firsts = {(t["leg"], t["length"]): t for t in summary["first_turns"]}
    assert set(firsts) == {(leg, n) for leg in ("off", "on") for n in (200, 800)}
    first = firsts[("on", 200)]
    assert first["n"] == 2 and first["decode_engine"]["ttft"] == {"mean_ms": pytest.approx(8.0), "count": 2}
    assert first["decode_api_http_ms"] == pytest.approx(first["decode_hop_ms"] - 8.0)
    report = (out / "report.md").read_text()
    assert "## Where ON's TTFT goes (ms)" in report and "## Engine-side figures per role" in report
    assert "## First turns per leg: where TTFT goes (ms)" in report
    assert "| 200 | turns >= 2 | prefill | 4 |" in report and "10.0 (4)" in report
    assert (out / "ttft_vs_prompt_length.png").read_bytes()[:4] == b"\x89PNG"


def test_without_a_decode_url_the_bound_is_skipped_with_one_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with ThreadedFake(FakeRouter(first_token_delay=0.0, token_delay=0.0)) as fake:
        args = _args("--url", fake.url, "--lengths", "50", *WORKLOAD, "--out", str(tmp_path), "--no-warmup")
        assert args.run(args) == 0
    assert not (tmp_path / "records-bound.json").exists()
    note = "bound: not measured, no decode engine URL known (with --url, add --engine-url decode=URL)"
    assert (tmp_path / "report.md").read_text().count(note) == 1
    assert note in capsys.readouterr().err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rows"][0]["bound"] is None and summary["rows"][0]["on_over_bound"] is None
    assert summary["ttft_breakdown"][0]["bound"]["ttft_p50_ms"] is None


def test_a_url_run_with_a_decode_url_measures_the_bound(tmp_path: Path) -> None:
    decode = FakeEngine(model="fake-model")
    with (
        ThreadedFake(FakeRouter(first_token_delay=0.0, token_delay=0.0, decode=decode)) as fake,
        ThreadedFake(decode) as engine,
    ):
        args = _args(
            "--url", fake.url, "--engine-url", f"decode={engine.url}", "--lengths", "50", *WORKLOAD,
            "--out", str(tmp_path), "--no-warmup",
        )  # fmt: skip
        assert args.run(args) == 0
    assert len(read_records(tmp_path / "records-bound.json")) == 2 * 3
    summary = json.loads((tmp_path / "summary.json").read_text())
    where = summary["ttft_breakdown"][0]
    assert where["bound"]["decode_engine"]["ttft"]["mean_ms"] == pytest.approx(7.0)
    assert where["decode_engine"]["ttft"]["mean_ms"] == pytest.approx(8.0)
    assert where["prefill_engine"]["ttft"] == {"mean_ms": None, "count": None}  # prefill was not named


def test_no_bound_turns_it_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pdx_bench.sweep._local_topology", FakeTopology)
    args = _args(
        "-f", str(EXAMPLE), "--local", "--legs", "on", "--lengths", "200", *WORKLOAD, "--out", str(tmp_path),
        "--no-warmup", "--no-bound",
    )  # fmt: skip
    assert args.run(args) == 0
    assert not (tmp_path / "records-bound.json").exists()
    (decode,) = FakeTopology.decodes
    assert decode.bodies == []
    assert "bound: not measured (--no-bound)" in (tmp_path / "report.md").read_text()
    assert "--no-bound" in cli._bench_args(args)


def test_an_unreachable_decode_skips_the_bound_instead_of_failing_every_turn(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with ThreadedFake(FakeRouter(first_token_delay=0.0, token_delay=0.0)) as fake:
        args = _args(
            "--url", fake.url, "--engine-url", f"decode={dead}", "--lengths", "50", *WORKLOAD,
            "--out", str(tmp_path), "--no-warmup",
        )  # fmt: skip
        assert args.run(args) == 0
    report = (tmp_path / "report.md").read_text()
    assert f"bound: not measured, decode engine {dead} not reachable" in report
    assert f"engine metrics: {dead} not reachable" in report
    assert not (tmp_path / "errors.json").exists()


def test_a_decode_that_refuses_plain_requests_reports_the_bound_as_failed(tmp_path: Path) -> None:
    decode = FakeEngine(model="fake-model", status=400)
    with ThreadedFake(FakeRouter(first_token_delay=0.0, token_delay=0.0)) as fake, ThreadedFake(decode) as engine:
        args = _args(
            "--url", fake.url, "--engine-url", f"decode={engine.url}", "--lengths", "50", *WORKLOAD,
            "--out", str(tmp_path), "--no-warmup",
        )  # fmt: skip
        assert args.run(args) == 1
    errors = json.loads((tmp_path / "errors.json").read_text())
    assert {e["leg"] for e in errors} == {"bound"} and len(errors) == 2  # each conversation stops at turn 1
    assert len(read_records(tmp_path / "records-run.json")) == 2 * 3  # the run itself is whole


def test_a_decode_serving_another_name_gets_that_name_with_a_note(tmp_path: Path) -> None:
    decode = FakeEngine(model="other-name")
    with ThreadedFake(FakeRouter(first_token_delay=0.0, token_delay=0.0)) as fake, ThreadedFake(decode) as engine:
        args = _args(
            "--url", fake.url, "--engine-url", f"decode={engine.url}", "--lengths", "50", *WORKLOAD,
            "--out", str(tmp_path), "--no-warmup",
        )  # fmt: skip
        assert args.run(args) == 0
    assert {b["model"] for b in decode.bodies} == {"other-name"}
    assert "bound: decode serves 'other-name', not 'fake-model'" in (tmp_path / "report.md").read_text()


def test_the_off_leg_has_no_bound() -> None:
    cfg = SweepConfig(lengths=[100], spec=SPEC, legs=[False])
    assert total_requests(cfg) == 2 * 3
    results = run_sweep(LocalTarget(example_doc(), factory=FakeTopology), cfg, lambda ep: WordCounter())
    assert [r.leg for r in results] == ["off"] and results[0].notes == []


def test_no_conversation_id_sends_none_for_the_router_to_find_by_history_warm_up_included(tmp_path: Path) -> None:
    with ThreadedFake(FakeRouter(first_token_delay=0.0, token_delay=0.0)) as fake:
        args = _args(
            "--url", fake.url, "--lengths", "50", *WORKLOAD, "--out", str(tmp_path), "--no-bound",
            "--no-conversation-id",
        )  # fmt: skip
        assert args.run(args) == 0
        router = fake.fake
    assert len(router.bodies) == 2 + 2 * 3  # the warm-up conversation's two turns, then the point's
    assert not any("conversation_id" in b for b in router.bodies)
    assert not any("X-Session-ID" in h for h in router.headers)
    assert "--no-conversation-id" in cli._bench_args(args)
