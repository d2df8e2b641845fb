"""Named legs and the suffix sweep: router-only legs share the engines, each point its own turns."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from pdx_bench import cli
from pdx_bench.sweep import Leg, LocalTarget, SweepConfig, run_sweep, total_requests
from pdx_bench.workload import WordCounter, WorkloadSpec, build

from .fakeserver import EXAMPLE, FakeTopology, example_doc

SPEC = WorkloadSpec(turns=3, conversations=2, user_tokens=4, tool_tokens=4, output_tokens=2)
DP = Leg("dp", (("router.decodeLocalMaxTokens", 0),))
LOCAL = Leg("local", (("router.decodeLocalMaxTokens", 8192), ("router.decodeLocalMaxBusy", 16)))


def _config(*legs: Leg, suffixes: list[int] | None = None) -> SweepConfig:
    return SweepConfig(lengths=[40, 80], spec=SPEC, legs=list(legs), bound=False, suffixes=suffixes or [8, 32])


def test_legs_that_change_only_router_fields_start_the_engines_once_and_restart_the_router() -> None:
    target = LocalTarget(example_doc(), factory=FakeTopology)
    results = run_sweep(target, _config(DP, LOCAL), lambda ep: WordCounter())
    assert len(FakeTopology.started) == 1 and target.router_only == ["local"]
    [reconfigured] = FakeTopology.reconfigured
    assert reconfigured["spec"]["router"]["decodeLocalMaxTokens"] == 8192
    assert reconfigured["spec"]["router"]["decodeLocalMaxBusy"] == 16
    assert len(FakeTopology.routers) == 1  # stopped once, after the last leg
    dp, local = results
    assert {r.reuse for r in dp.records if r.turn > 1} == {"hit"}
    assert {r.reuse for r in local.records if r.turn > 1} == {"local"}


def test_a_leg_that_changes_the_engines_starts_a_new_topology() -> None:
    engines = Leg("ttl", (("kvTransfer.decoderKvBlocksTtlSeconds", 60),))
    target = LocalTarget(example_doc(), factory=FakeTopology)
    run_sweep(target, _config(DP, engines), lambda ep: WordCounter())
    assert len(FakeTopology.started) == 2 and FakeTopology.reconfigured == [] and target.router_only == []
    assert FakeTopology.started[1]["spec"]["kvTransfer"]["decoderKvBlocksTtlSeconds"] == 60


def test_fresh_engines_restart_everything_every_leg() -> None:
    target = LocalTarget(example_doc(), factory=FakeTopology, fresh_engines=True)
    run_sweep(target, _config(DP, LOCAL), lambda ep: WordCounter())
    assert len(FakeTopology.started) == 2 and FakeTopology.reconfigured == []


def test_every_point_runs_its_own_conversations_and_named_legs_send_other_texts_of_the_same_sizes() -> None:
    cfg = _config(DP, LOCAL)
    assert total_requests(cfg) == 2 * 2 * 2 * SPEC.turns * SPEC.conversations
    dp, local = run_sweep(LocalTarget(example_doc(), factory=FakeTopology), cfg, lambda ep: WordCounter())
    points = {(r.prefix_tokens, r.suffix_tokens) for r in dp.records}
    assert points == {(40, 8), (40, 32), (80, 8), (80, 32)}
    for leg in (dp, local):
        assert len(leg.records) == 4 * SPEC.turns * SPEC.conversations
        ids = {r.conversation_id for r in leg.records}
        assert len(ids) == 4 * SPEC.conversations  # a point's conversations are never another's
    assert {r.conversation_id for r in dp.records}.isdisjoint({r.conversation_id for r in local.records})
    [router] = FakeTopology.routers
    texts: dict[str, set[str]] = {"dp": set(), "local": set()}
    for body in router.bodies:
        conv = str(body["conversation_id"])
        if len(body["messages"]) > 2 and "warmup" not in conv:
            texts["local" if "-local-" in conv else "dp"].add(body["messages"][-1]["content"])
    assert texts["dp"] and texts["dp"].isdisjoint(texts["local"])  # decode caches nothing of the other leg's
    assert sorted(r.input_num_tokens for r in dp.records) == sorted(r.input_num_tokens for r in local.records)


@pytest.mark.parametrize(("new", "user", "tool"), [(128, 64, 64), (16, 8, 8), (4096, 64, 4032), (1, 0, 1)])
def test_a_suffix_is_an_instruction_of_at_most_user_tokens_after_a_tool_result(new: int, user: int, tool: int) -> None:
    spec = WorkloadSpec(user_tokens=64, tool_tokens=192).with_new_tokens(new)
    assert (spec.user_tokens, spec.tool_tokens) == (user, tool)
    turn = build(spec.with_prefix(20), WordCounter()).conversations[0].turns[1]
    assert abs(turn.tokens - new) <= 6  # the leads ("Result of <tool>:", "Step 2 of task 0:") stay in


def test_a_threshold_between_two_suffixes_serves_only_the_shorter_locally() -> None:
    local = Leg("local", (("router.decodeLocalMaxTokens", 20),))  # the fake counts the last message + 4
    [result] = run_sweep(
        LocalTarget(example_doc(), factory=FakeTopology), _config(local, suffixes=[8, 64]), lambda ep: WordCounter()
    )
    by_suffix = {s: {r.reuse for r in result.records if r.turn > 1 and r.suffix_tokens == s} for s in (8, 64)}
    assert by_suffix == {8: {"local"}, 64: {"hit"}}


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    cli.add_parser(p.add_subparsers())
    return p.parse_args(["bench", *argv])


def test_leg_flags_name_the_leg_and_read_values_as_yaml() -> None:
    args = _args("--leg", "dp:router.decodeLocalMaxTokens=0", "--leg", "x:router.a=8192,kvTransfer.b=true,c.d=id")
    assert args.named_legs == [
        Leg("dp", (("router.decodeLocalMaxTokens", 0),)),
        Leg("x", (("router.a", 8192), ("kvTransfer.b", True), ("c.d", "id"))),
    ]
    again = _args(*cli._bench_args(args))  # the in-cluster Job runs the same legs
    assert again.named_legs == args.named_legs


@pytest.mark.parametrize("bad", ["on:router.a=1", "bound:", "Dp:router.a=1", "dp:router.a", "dp:a..b=1"])
def test_a_leg_flag_that_cannot_name_a_leg_is_refused(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _args("--leg", bad)
    assert "--leg" in capsys.readouterr().err


def test_named_legs_run_after_the_flipped_ones(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """`--legs off,on --leg pinned:...`: the overcommit run's three legs, OFF and ON first."""
    seen: list[list[str]] = []

    def sweep(target: Any, cfg: SweepConfig, *_: Any) -> list[Any]:
        seen.append([leg.name for leg in cfg.leg_list()])
        return []

    monkeypatch.setattr(cli, "run_sweep", sweep)
    args = _args(
        "-f", str(EXAMPLE), "--out", str(tmp_path), "--legs", "off,on",
        "--leg", "pinned:kvTransfer.releaseUnderPressure=false",
    )  # fmt: skip
    args.run(args)
    assert seen == [["off", "on", "pinned"]]


def test_the_longest_suffix_counts_against_max_model_len(capsys: pytest.CaptureFixture[str]) -> None:
    doc: dict[str, Any] = example_doc()
    limit = int(doc["spec"]["model"]["maxModelLen"])
    fits = limit - SPEC.turns * 200 - 3000
    assert WorkloadSpec(prefix_tokens=fits, turns=3).last_turn_tokens() < limit  # fits with the default sizes
    args = _args("-f", str(EXAMPLE), "--lengths", str(fits), "--suffix-tokens", "8,3000", "--turns", "3")
    assert args.run(args) == 2
    assert "maxModelLen" in capsys.readouterr().err
