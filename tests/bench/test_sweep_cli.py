"""The sweep end to end: the local target flips the CR, the CLI writes records, plots, report."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from pdx_bench import cli
from pdx_bench.records import VLLM_FIELDS, read_records
from pdx_bench.sweep import LocalTarget, SweepConfig, UrlTarget, run_sweep
from pdx_bench.workload import WordCounter, WorkloadSpec

from .fakeserver import EXAMPLE, FakeRouter, FakeTopology, ThreadedFake, example_doc

K8S_VERSION = "1.37.0"


def test_local_sweep_flips_the_cr_per_leg() -> None:
    cfg = SweepConfig(
        lengths=[100, 400], spec=WorkloadSpec(turns=3, conversations=2, user_tokens=5, tool_tokens=5, output_tokens=3)
    )
    target = LocalTarget(example_doc(), factory=FakeTopology)
    seen: list[str] = []
    results = run_sweep(target, cfg, lambda ep: WordCounter(), on_leg_start=seen.append)
    assert seen == ["off", "on"]
    assert [d["spec"]["kvTransfer"]["bidirectional"] for d in FakeTopology.started] == [False, True]
    assert example_doc()["spec"]["kvTransfer"]["bidirectional"] is True  # the user's document is not edited in place
    off, on, bound = results  # the bound: measured while ON's topology serves
    assert bound.leg == "bound" and len(bound.records) == len(on.records)
    assert len(off.records) == len(on.records) == 2 * 2 * 3
    assert {r.reuse for r in off.records} == {"miss"}
    assert {r.reuse for r in on.records if r.turn > 1} == {"hit"}
    assert {r.kv_transfer_source for r in on.records} == {"request"}
    assert set(target.start_seconds) == {"off", "on"}
    # Both legs sent the same prompts under different conversation ids.
    assert {r.conversation_id for r in off.records}.isdisjoint({r.conversation_id for r in on.records})
    assert sorted(r.input_num_tokens for r in off.records) == sorted(r.input_num_tokens for r in on.records)


def test_url_target_refuses_to_flip() -> None:
    with pytest.raises(ValueError, match="cannot flip"), UrlTarget("http://127.0.0.1:1").serve(True):
        pass


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    cli.add_parser(sub)
    return p.parse_args(["bench", *argv])


def test_cli_local_run_writes_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("pdx_bench.sweep._local_topology", FakeTopology)
    out = tmp_path / "out"
    args = _args(
        "-f", str(EXAMPLE), "--local", "--lengths", "200,800", "--turns", "3", "--conversations", "2",
        "--user-tokens", "5", "--tool-tokens", "5", "--output-tokens", "3", "--out", str(out),
    )  # fmt: skip
    assert args.run(args) == 0
    printed = capsys.readouterr().out
    assert "OFF p50" in printed and "ttft_plot:" in printed and str(out / "report.md") in printed
    for name in (
        "records-off.json",
        "records-on.json",
        "ttft_vs_prompt_length.png",
        "prefill_breakdown.png",
        "report.md",
        "summary.json",
    ):
        assert (out / name).is_file(), name
    assert (out / "ttft_vs_prompt_length.png").read_bytes()[:4] == b"\x89PNG"
    raw = json.loads((out / "records-on.json").read_text())
    assert all(k in raw[0] for k in VLLM_FIELDS)
    assert len(read_records(out / "records-off.json")) == 12
    summary = json.loads((out / "summary.json").read_text())
    assert [r["length"] for r in summary["rows"]] == [200, 800]
    assert summary["rows"][1]["on"]["hit_rate"] == 1.0 and summary["rows"][1]["off"]["hit_rate"] == 0.0
    assert summary["rows"][0]["on"]["kv_transfer_ms"] == pytest.approx(4.0)
    assert summary["errors"] == 0
    # The served model name comes from the CR.
    assert FakeTopology.models == {"pdx-tiny"}
    report = (out / "report.md").read_text()
    assert "on leg peak RSS**: local-prefill-0 4.50 GiB, local-router-0 0.04 GiB" in report


def test_cli_url_mode_runs_one_leg(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with ThreadedFake(FakeRouter(first_token_delay=0.0, token_delay=0.0)) as fake:
        args = _args(
            "--url", fake.url, "--lengths", "50", "--turns", "2", "--conversations", "1", "--user-tokens", "3",
            "--tool-tokens", "3", "--output-tokens", "2", "--out", str(tmp_path), "--no-warmup",
        )  # fmt: skip
        assert args.run(args) == 0
        assert fake.fake.bodies[0]["model"] == "fake-model"  # asked the router's /v1/models
    assert (tmp_path / "records-run.json").is_file() and not (tmp_path / "records-off.json").exists()


@pytest.mark.parametrize("facts", [True, False], ids=["reuse_headers", "none"])
def test_a_router_that_keeps_reuse_facts_to_itself_is_named_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], facts: bool
) -> None:
    with ThreadedFake(FakeRouter(first_token_delay=0.0, token_delay=0.0, reuse_headers=facts)) as fake:
        args = _args(
            "--url", fake.url, "--lengths", "50", "--turns", "2", "--conversations", "1", "--user-tokens", "3",
            "--tool-tokens", "3", "--output-tokens", "2", "--out", str(tmp_path), "--no-warmup",
        )  # fmt: skip
        assert args.run(args) == 0
    told = "spec.router.reuseHeaders: true" in capsys.readouterr().err
    assert told is not facts
    assert ("reuseHeaders" in (tmp_path / "report.md").read_text()) is not facts


def test_cli_rejects_a_sweep_over_max_model_len(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = _args("-f", str(EXAMPLE), "--local", "--lengths", "8000", "--out", str(tmp_path))
    assert args.run(args) == 2
    assert "maxModelLen" in capsys.readouterr().err


def test_in_cluster_job_validates(capsys: pytest.CaptureFixture[str]) -> None:
    args = _args("-f", str(EXAMPLE), "--in-cluster", "--namespace", "ml", "--lengths", "1000,8000", "--turns", "6")
    assert args.run(args) == 0
    objs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [o["kind"] for o in objs] == ["ServiceAccount", "Role", "RoleBinding", "Job"]
    for obj in objs:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    job = objs[-1]
    container = job["spec"]["template"]["spec"]["containers"][0]
    argv = container["command"] + container["args"]
    assert argv[:3] == ["pdx", "bench", "--cluster"]
    assert argv[argv.index("--name") + 1] == "local" and argv[argv.index("--namespace") + 1] == "ml"
    assert argv[argv.index("--lengths") + 1] == "1000,8000" and argv[argv.index("--turns") + 1] == "6"
    assert "--in-cluster" not in argv and "-f" not in argv
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == objs[0]["metadata"]["name"]
    rules = objs[1]["rules"]
    assert rules[0]["resourceNames"] == ["local"] and set(rules[0]["verbs"]) == {"get", "patch"}
    # The cluster target re-parses what the Job runs.
    again = _args(*container["args"][1:])
    assert again.cluster and again.name == "local" and again.lengths == [1000, 8000]


def test_in_cluster_results_claim(capsys: pytest.CaptureFixture[str]) -> None:
    args = _args("--in-cluster", "--name", "x", "--namespace", "y", "--results-claim", "bench-pvc", "--cluster")
    assert args.run(args) == 0
    job = list(yaml.safe_load_all(capsys.readouterr().out))[-1]
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    vols = job["spec"]["template"]["spec"]["volumes"]
    assert {"name": "results", "persistentVolumeClaim": {"claimName": "bench-pvc"}} in vols


def test_a_named_leg_may_set_an_engines_environment_variable() -> None:
    from pdx_bench.cli import _named_leg

    leg = _named_leg("shorten:kvTransfer.bidirectional=true,decode.env.PDX_HELD_KV_SHORTEN='1'")
    assert leg.changes == (("kvTransfer.bidirectional", True), ("decode.env.PDX_HELD_KV_SHORTEN", "1"))
    with pytest.raises(argparse.ArgumentTypeError, match="dotted path under spec"):
        _named_leg("bad:decode.env.A-B=1")


def test_every_legs_resource_is_checked_before_the_first_leg_runs() -> None:
    from pdx.resource import SpecError

    doc = example_doc()
    cli.check_legs(doc, [False, True, cli._named_leg("shorten:decode.env.PDX_HELD_KV_SHORTEN='1'")])
    bad = cli._named_leg("nocrowd:decode.env.PDX_X=yes")  # YAML reads yes as a boolean
    with pytest.raises(SpecError) as err:
        cli.check_legs(doc, [False, True, bad])
    assert err.value.problems[0].startswith("--leg nocrowd: spec.decode.env.PDX_X")
