"""The correctness run's checks and summary (tests/e2e/correctness.py) on made-up runs, no engines.

The end-to-end tests judge real CPU engines with the same checks; these show that each check
fails when what it guards goes wrong, which a run of right engines cannot show.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from pdx_bench import wavetargets
from tests.e2e.chat import Answer
from tests.e2e.correctness import (
    COMPARED,
    FIRST_TOKEN,
    FIRST_TOKEN_RUN,
    FOLLOW_UPS,
    PLUGINS,
    Leg,
    OutOfTime,
    Turn,
    entry_points,
    expected_reuse,
    first_token_checks,
    judge,
    main,
    markdown,
    plugin_report,
    with_settings,
    write_summary,
)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-correct.sh"
TURNS = {"grow": 3, "truncated": 3, "long0": 3, "long1": 3, "long2": 3}
GPU_LOG = (
    "(APIServer pid=7) INFO 12-03 11:43:35 [prefix_check.py:78] pdx plugin: NIXL reads of decode's KV check the"
    " prompt's tokens\n(EngineCore_DP0 pid=9) INFO 12-03 11:43:56 [prefix_check.py:78] pdx plugin: NIXL reads of"
    " decode's KV check the prompt's tokens\n(EngineCore_DP0 pid=9) INFO 12-03 11:43:57 [core.py:133] Initializing\n"
    "(EngineCore_DP0 pid=9) INFO 12-03 11:43:58 [held_kv.py:252] pdx plugin: held KV yields to new work under"
    " pressure (valve on)\n(APIServer pid=7) INFO 12-03 11:43:59 [holds_route.py:72] pdx plugin:"
    " vllm.entrypoints.launchers.app serves /v1/pdx/holds (claims on decode's held KV)\n"
    "(APIServer pid=7) INFO 12-03 11:44:10 [detokenize_prime.py:89] pdx plugin: a first token was detokenized"
    " against the prompt's last ids, not all 2073\n"
    "(EngineCore_DP0 pid=9) INFO 12-03 11:43:56 [block_order.py:76] pdx plugin: KV blocks are handed out in"
    " ascending order (NIXL merges their runs)\n"
)


def answer(prompt: list[int], out: list[int], reuse: str = "", reused: int = 0) -> Answer:
    headers = {"x-pdx-reuse": reuse, "x-pdx-reused-tokens": str(reused)} if reuse else {}
    return Answer("t", [-0.5] * len(out), [str(i) for i in out], 10.0, headers, len(prompt), out, prompt)


def conversation(name: str, on: bool) -> list[Turn]:
    """Turns as right engines give them: later prompts extend the held tokens, except where
    the scenario edits the history; on reads what the edit left in common, off reads nothing."""
    prompt, out = [1000 + i for i in range(200)], [7, 8, 9]
    turns = [Turn(answer(prompt, out, "miss"), 0.0)]
    for _ in range(1, TURNS.get(name, 2)):
        held = [*prompt, *out][:-1]
        if name == "edited":
            prompt, reuse, reused = [*prompt[:100], 5, *prompt[101:], *out, 11, 12], "hit", 64
        elif name in ("edited_first", "diverged"):
            prompt, reuse, reused = [1000, 5, *prompt[2:], *out, 11, 12], "below_threshold", 0
        else:
            prompt, reuse, reused = [*prompt, *out, 11, 12], "hit", len(held)
        turns.append(Turn(answer(prompt, out, reuse if on else "miss", reused if on else 0), float(on and reused > 0)))
    return turns


def leg(on: bool, tmp_path: Path, log: str = GPU_LOG) -> Leg:
    logs = {}
    for engine in ("prefill-0", "decode-0"):
        logs[engine] = tmp_path / f"{'on' if on else 'off'}-{engine}.log"
        logs[engine].write_text(log)
    stats = {"reuse": {"hit": 5}, "promptIds": {"local": 0, "engine": 0}, "tokenizeMismatch": 0}
    turns = {name: conversation(name, on) for name in COMPARED}
    return Leg(on, turns, stats, logs, {engine: {} for engine in logs}, block_size=64, threshold=64)


def failed(off: Leg, on: Leg) -> dict[str, str]:
    return {c.name: c.detail for c in judge(off, on).checks if not c.passed}


def test_runs_as_right_engines_give_them_pass_every_check(tmp_path: Path) -> None:
    verdict = judge(leg(False, tmp_path), leg(True, tmp_path))
    assert verdict.passed, verdict.failures
    figures = verdict.figures
    assert figures["turnsCompared"] == figures["turnsEqual"] == 23
    assert figures["onHits"] == 2 + 1 + 2 + 1 + 6  # grow, edited, truncated, stripped, long*
    assert figures["edited"] == [{"turn": 1, "reuse": "hit", "reusedTokens": 64, "held": 202, "commonWithHeld": 100}]
    assert figures["firstMessageEdited"]["edited_first"]["commonWithHeld"] == 1


def test_one_different_output_token_fails_naming_the_turn_and_where_it_differs(tmp_path: Path) -> None:
    on = leg(True, tmp_path)
    turn = on.turns["long1"][2]
    on.turns["long1"][2] = replace(turn, answer=replace(turn.answer, token_ids=[7, 4, 9]))
    assert failed(leg(False, tmp_path), on) == {"greedy_outputs_equal": "long1 turn 2 differs at token 1"}


def test_logprobs_drifting_past_the_tolerance_fail_though_the_tokens_agree(tmp_path: Path) -> None:
    on = leg(True, tmp_path)
    turn = on.turns["grow"][1]
    on.turns["grow"][1] = replace(turn, answer=replace(turn.answer, logprobs=[-0.5, -0.51, -0.5]))
    assert list(failed(leg(False, tmp_path), on)) == ["logprobs_close"]


def test_a_turn_that_reads_less_than_it_shares_with_decode_fails(tmp_path: Path) -> None:
    on = leg(True, tmp_path)
    turn = on.turns[FOLLOW_UPS[0]][1]
    on.turns[FOLLOW_UPS[0]][1] = replace(turn, answer=answer(turn.answer.prompt_ids or [], [7, 8, 9], "hit", 128))
    assert failed(leg(False, tmp_path), on) == {
        "later_turns_read_the_whole_blocks_they_share": "grow turn 1 (hit): 128 reused, 202 expected "
        "(202 of 202 held in common, blocks of 64)"
    }


def test_a_follow_up_that_recomputes_fails_though_its_output_is_right(tmp_path: Path) -> None:
    on = leg(True, tmp_path)
    turn = on.turns["long2"][1]
    on.turns["long2"][1] = Turn(answer(turn.answer.prompt_ids or [], [7, 8, 9], "miss"), 0.0)
    assert list(failed(leg(False, tmp_path), on)) == [
        "later_turns_read_the_whole_blocks_they_share",
        "follow_ups_reuse",
    ]


def agent_leg(tmp_path: Path) -> Leg:
    """The third run as right engines give it: OFF's text on every turn, asked without
    log-probabilities or ids, each turn opened by the router with prefill's token, every
    follow-up read from decode."""
    first = leg(True, tmp_path)
    for name, turns in first.turns.items():
        for i, t in enumerate(turns):
            headers = {**t.answer.headers, "x-request-id": f"{name}-{i}"}
            opened = Answer(t.answer.text, [], [], 9.0, headers, t.answer.prompt_tokens)
            opened.first_id = f"chatcmpl-{name}-{i}"
            turns[i] = Turn(opened, 1.0 if i else 0.0)
    return first


def test_a_third_run_with_prefills_first_token_passes_when_it_says_what_off_said(tmp_path: Path) -> None:
    verdict = judge(leg(False, tmp_path), leg(True, tmp_path), first=agent_leg(tmp_path))
    assert verdict.passed, verdict.failures
    names = [c.name for c in verdict.checks]
    assert {"first_token_text_equal", "first_token_from_prefill", "first_token_follow_ups_read"} <= set(names)
    assert verdict.figures["firstToken"]["opened"] == verdict.figures["firstToken"]["turns"] == 23


def test_the_third_run_fails_on_other_text_on_decodes_own_opening_and_on_a_follow_up_not_read(tmp_path: Path) -> None:
    off, first = leg(False, tmp_path), agent_leg(tmp_path)
    t = first.turns["grow"][1]
    first.turns["grow"][1] = replace(t, answer=replace(t.answer, text="u"))
    t = first.turns["long0"][0]
    first.turns["long0"][0] = replace(t, answer=replace(t.answer, first_id="chatcmpl-decodes-own"))
    t = first.turns["long1"][2]
    first.turns["long1"][2] = replace(t, reads=0.0)
    checks = {c.name: c for c in first_token_checks(off, first)[0]}
    text = checks["first_token_text_equal"]
    assert not text.passed and "grow turn 1: 'u' != 't'" in text.detail
    assert checks["first_token_from_prefill"].detail == "long0 turn 0 (miss): first chunk 'chatcmpl-decodes-own'"
    assert checks["first_token_follow_ups_read"].detail == "long1 turn 2: hit, 0 reads"


def test_a_turn_whose_first_token_ends_the_answer_need_not_open_with_prefills(tmp_path: Path) -> None:
    """One token, or a first token that is part of a character: the router keeps the usual path."""
    off, first = leg(False, tmp_path), agent_leg(tmp_path)
    for name, tokens in (("grow", ["7"]), ("long0", ["\ufffd", "8"])):
        off.turns[name][0] = replace(off.turns[name][0], answer=replace(off.turns[name][0].answer, tokens=tokens))
        t = first.turns[name][0]
        first.turns[name][0] = replace(t, answer=replace(t.answer, first_id="chatcmpl-decodes"))
    checks, figures = first_token_checks(off, first)
    assert all(c.passed for c in checks) and figures["opened"] == 21


def test_the_command_with_first_token_runs_a_third_topology_as_agents_ask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[dict[str, object]] = []
    asked: list[bool] = []

    class Topology:
        def __init__(self, document: dict[str, object], state_dir: Path) -> None:
            started.append(document)

        def __enter__(self) -> Topology:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    legs = iter([leg(False, tmp_path), leg(True, tmp_path), agent_leg(tmp_path)])

    def run_leg(topo: object, as_agent: bool = False) -> Leg:
        asked.append(as_agent)
        return next(legs)

    _without_engines(monkeypatch, Topology, run_leg)
    assert main(["--out", str(tmp_path / "out"), "--first-token"]) == 0
    assert asked == [False, False, True]
    router = started[2]["spec"]["router"]  # type: ignore[index]
    assert {f"router.{k}": v for k, v in router.items() if f"router.{k}" in FIRST_TOKEN} == FIRST_TOKEN
    assert started[2]["spec"]["kvTransfer"]["bidirectional"] is True  # type: ignore[index]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["passed"] and summary["figures"]["firstToken"]["equal"] == 23
    assert "prefill's first token streamed" in (tmp_path / "out" / "summary.md").read_text()


def local(turn: Turn, decode_hits: float, router_says: int = 202) -> Turn:
    """The same turn prefilled on decode: no NIXL read; decode found `decode_hits` tokens in its cache."""
    return Turn(
        replace(turn.answer, headers={"x-pdx-reuse": "local", "x-pdx-reused-tokens": str(router_says)}),
        0.0,
        decode_hits,
    )


def test_decode_local_follow_ups_pass_by_decodes_own_cache_hits(tmp_path: Path) -> None:
    on = leg(True, tmp_path)
    for name in ("grow", "long0"):
        for i in (1, 2):
            turn = on.turns[name][i]
            on.turns[name][i] = local(turn, 192.0 if i == 1 else 256.0)  # whole 64-token blocks of what it shares
    verdict = judge(leg(False, tmp_path), on)
    assert verdict.passed, verdict.failures
    row = next(r for r in verdict.turns if r["conversation"] == "grow" and r["turn"] == 1)
    assert (row["reuse"], row["reusedTokens"], row["routerReusedTokens"], row["expectedReuse"]) == (
        "local",
        192,
        202,
        192,
    )


def test_a_decode_local_turn_that_found_nothing_in_decodes_cache_fails(tmp_path: Path) -> None:
    on = leg(True, tmp_path)
    on.turns["grow"][1] = local(on.turns["grow"][1], 0.0)
    assert failed(leg(False, tmp_path), on) == {
        "later_turns_read_the_whole_blocks_they_share": "grow turn 1 (local): 0 reused, 192 expected "
        "(202 of 202 held in common, blocks of 64)",
        "follow_ups_reuse": "grow turn 1: local, 0 reads, 0 tokens from decode's cache",
    }


def test_engines_that_send_no_prompt_ids_fail_the_read_check_saying_so(tmp_path: Path) -> None:
    on = leg(True, tmp_path)
    turn = on.turns["grow"][2]
    on.turns["grow"][2] = replace(turn, answer=replace(turn.answer, prompt_ids=None))
    assert failed(leg(False, tmp_path), on) == {
        "later_turns_read_the_whole_blocks_they_share": "grow turn 2: the engines sent no token ids to count what "
        "decode held"
    }


def test_the_expected_read_is_all_decode_holds_or_the_whole_blocks_shared_and_none_below_the_threshold() -> None:
    assert expected_reuse(held=202, common=202, prompt=300, block=64, threshold=64) == 202  # the partial block too
    assert expected_reuse(held=202, common=201, prompt=300, block=64, threshold=64) == 192
    assert expected_reuse(held=202, common=100, prompt=300, block=64, threshold=64) == 64
    assert expected_reuse(held=202, common=63, prompt=300, block=16, threshold=64) == 0
    assert expected_reuse(held=202, common=202, prompt=150, block=64, threshold=64) == 128  # the last token computed
    assert expected_reuse(held=202, common=100, prompt=300, block=None, threshold=64) is None


def test_an_edited_history_that_reads_past_the_edit_fails(tmp_path: Path) -> None:
    on = leg(True, tmp_path)
    turn = on.turns["edited"][1]
    on.turns["edited"][1] = replace(turn, answer=answer(turn.answer.prompt_ids or [], [7, 8, 9], "hit", 192))
    assert list(failed(leg(False, tmp_path), on)) == [
        "later_turns_read_the_whole_blocks_they_share",
        "edited_history_reads_only_the_common_prefix",
    ]


def test_a_first_message_edit_that_still_reads_kv_fails(tmp_path: Path) -> None:
    on = leg(True, tmp_path)
    on.turns["edited_first"][1] = replace(on.turns["edited_first"][1], reads=1.0)
    assert failed(leg(False, tmp_path), on) == {
        "first_message_edited_reads_nothing": "edited_first turn 1: below_threshold, 0 reused, 1 reads"
    }


def test_reuse_with_bidirectional_off_fails(tmp_path: Path) -> None:
    off = leg(False, tmp_path)
    off.turns["grow"][1] = replace(off.turns["grow"][1], reads=2.0)
    assert failed(off, leg(True, tmp_path)) == {"off_never_reuses": "prefill read 2 times"}


def test_a_router_that_tokenized_for_the_engines_fails_the_prefix_check_check(tmp_path: Path) -> None:
    on = leg(True, tmp_path)
    on.router_stats["promptIds"] = {"local": 0, "engine": 3}
    assert list(failed(leg(False, tmp_path), on)) == ["engines_checked_the_prefix"]


def test_a_plugin_error_in_any_engine_log_fails_and_is_quoted(tmp_path: Path) -> None:
    error = "(APIServer pid=7) ERROR 12-03 11:43:35 [prefix_check.py:85] pdx plugin: this vLLM has no X; check OFF"
    on = leg(True, tmp_path, GPU_LOG + error + "\n")
    detail = failed(leg(False, tmp_path), on)["plugins_loaded"]
    assert detail == f"on/prefill-0: {error}; on/decode-0: {error}"


def test_plugins_switched_on_by_the_engines_environment_must_each_log_a_line() -> None:
    cpu_env = {"PDX_NIXL_PROGRESS_DELAY_US": "1000", "PDX_ENGINE_IDLE_WAIT_MS": "3000", "PDX_SHM_RECHECK_MS": "2"}
    counts, problems = plugin_report(GPU_LOG, cpu_env)
    assert counts["pdx_prefix_check"] == 2 and counts["pdx_stream_kv_params"] == 0
    assert problems == [
        "pdx_nixl_progress_delay is on and logged nothing",
        "pdx_engine_idle_wait is on and logged nothing",
        "pdx_shm_recheck is on and logged nothing",
    ]
    assert plugin_report(GPU_LOG, {}) == (counts, [])  # a GPU engine: those three stay off


def test_a_failed_plugin_load_or_a_line_not_understood_is_a_problem() -> None:
    log = (
        "(APIServer pid=7) ERROR 12-03 11:43:35 [__init__.py:70] Failed to load plugin pdx_prefix_check\n"
        "pdx plugin: something without vLLM's prefix\n"
    )
    _, problems = plugin_report(GPU_LOG + log, {})
    assert problems == [
        "(APIServer pid=7) ERROR 12-03 11:43:35 [__init__.py:70] Failed to load plugin pdx_prefix_check",
        "not understood: pdx plugin: something without vLLM's prefix",
    ]


def test_every_pdx_plugin_entry_point_of_this_install_loads() -> None:
    assert entry_points() == dict.fromkeys(PLUGINS, "loads")


def test_a_plugin_entry_point_that_does_not_load_fails_the_run(tmp_path: Path) -> None:
    loaded = {**dict.fromkeys(PLUGINS, "loads"), "pdx_prefix_check": "ImportError: no module"}
    verdict = judge(leg(False, tmp_path), leg(True, tmp_path), loaded=loaded)
    assert verdict.failures == ["plugins_loaded: entry point pdx_prefix_check: ImportError: no module"]


def test_the_summary_files_carry_every_check_figure_and_turn(tmp_path: Path) -> None:
    verdict = judge(leg(False, tmp_path), leg(True, tmp_path))
    context = {"cr": "examples/local-gpu-correct.yaml", "device": "NVIDIA H200", "versions": "vllm 0.26.0"}
    write_summary(tmp_path, verdict, context)
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["passed"] is True and len(doc["checks"]) == len(verdict.checks) == 10
    assert len(doc["turns"]) == 23 and doc["figures"]["onReusedTokens"] == verdict.figures["onReusedTokens"]
    text = (tmp_path / "summary.md").read_text()
    assert text == markdown(verdict, context)
    assert text.startswith("# Greedy correctness, bidirectional off vs on: PASS\n")
    assert "| edited_first | 1 | 205 | yes | 0 | below_threshold | 0 | 0 | 202 | 1 | 0 |" in text


def test_settings_change_spec_fields_by_dotted_path_with_yaml_values() -> None:
    doc = {"spec": {"model": {"dtype": "float32", "extraArgs": ["--enforce-eager"]}}}
    out = with_settings(doc, ["model.dtype=bfloat16", "model.extraArgs=[]", "kvTransfer.blockSize=128"])
    assert out["spec"] == {"model": {"dtype": "bfloat16", "extraArgs": []}, "kvTransfer": {"blockSize": 128}}
    assert doc["spec"]["model"]["dtype"] == "float32"
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        with_settings(doc, ["model.dtype"])


def test_gpu_correct_sh_passes_shellcheck() -> None:
    tool = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")
    if tool is None:
        pytest.fail("shellcheck not installed: pip install -e '.[test]'")
    proc = subprocess.run([tool, str(SCRIPT)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout


def test_gpu_correct_sh_runs_this_checkouts_driver_with_the_settings_given(tmp_path: Path) -> None:
    """A stand-in Python records what the script runs: the driver of this checkout (its code
    first on the path), an absolute OUT_DIR, and each FIELD=VALUE as --set; its exit status."""
    record = tmp_path / "argv.json"
    fake = tmp_path / "python"
    fake.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"if sys.argv[1:3] == ['-m', 'tests.e2e.correctness']:\n"
        f"    json.dump([os.getcwd(), os.environ['PYTHONPATH'], sys.argv[3:]], open({str(record)!r}, 'w'))\n"
        "    sys.exit(1)\n"
    )
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake), "TOLERANCE": "1e-4", "PYTHONPATH": "/tmp/site", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        ["bash", str(SCRIPT), "out", "model.dtype=bfloat16", "model.extraArgs=[]"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    cwd, path, argv = json.loads(record.read_text())
    assert cwd == str(ROOT)
    assert path.split(":")[0] == str(ROOT / "operator") and path.endswith(":/tmp/site")
    out = str(tmp_path / "out")
    settings = ["--set", "model.dtype=bfloat16", "--set", "model.extraArgs=[]"]
    assert argv == ["--out", out, "-f", "examples/local-gpu-correct.yaml", "--tolerance", "1e-4", *settings]
    assert "exit 1 after" in proc.stdout and (tmp_path / "out" / "gpu.txt").is_file()


def test_gpu_correct_sh_with_first_token_1_asks_for_the_third_run(tmp_path: Path) -> None:
    record = tmp_path / "argv.json"
    fake = tmp_path / "python"
    fake.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"if sys.argv[1:3] == ['-m', 'tests.e2e.correctness']:\n"
        f"    json.dump(sys.argv[3:], open({str(record)!r}, 'w'))\n"
    )
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake), "FIRST_TOKEN": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        ["bash", str(SCRIPT), "out"], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(record.read_text())[-1] == "--first-token"


def test_gpu_correct_sh_without_an_output_folder_prints_its_usage_and_exits_2() -> None:
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("#   gpu-correct.sh OUT_DIR [FIELD=VALUE ...]")


def test_a_sigterm_during_the_run_stops_its_topology_and_leaves_an_error_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `timeout` in gpu-correct.sh sends: the engines must not be left holding the GPU."""
    stopped: list[Path] = []

    class Topology:
        def __init__(self, document: object, state_dir: Path) -> None:
            self.state_dir = state_dir

        def __enter__(self) -> Topology:
            return self

        def __exit__(self, *exc: object) -> None:
            stopped.append(self.state_dir)

    def run_leg(topo: object, as_agent: bool = False) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # a turn that hangs: the signal ends it

    monkeypatch.setattr("pdx.local.topology.LocalTopology", Topology)
    monkeypatch.setattr("pdx.local.gpus.visible_gpus", lambda: [])
    monkeypatch.setattr("tests.e2e.correctness.run_leg", run_leg)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["--out", str(tmp_path)]) == 2
    assert stopped == [tmp_path / "off"]
    assert json.loads((tmp_path / "summary.json").read_text())["error"] == "OutOfTime: signal 15: out of time"
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_third_run_out_of_time_still_judges_the_defaults_and_fails_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wave's GPU run of 2026-12-07 lost its defaults' verdict when time ran out in the third run."""
    legs = iter([leg(False, tmp_path), leg(True, tmp_path)])

    def run_leg(topo: object, as_agent: bool = False) -> Leg:
        if as_agent:  # the third run
            raise OutOfTime("signal 15: out of time")
        return next(legs)

    _without_engines(monkeypatch, _NoEngines, run_leg)
    assert main(["--out", str(tmp_path / "out"), "--first-token"]) == 1
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    checks = {c["name"]: c for c in summary["checks"]}
    assert not summary["passed"] and not checks[FIRST_TOKEN_RUN]["passed"]
    assert "OutOfTime: signal 15: out of time" in checks[FIRST_TOKEN_RUN]["detail"]
    assert all(c["passed"] for name, c in checks.items() if name != FIRST_TOKEN_RUN)
    assert wavetargets.correct(summary).met is True  # the defaults: judged, and they passed
    assert [v.met for v in wavetargets.correct_first(summary)] == [False]


class _NoEngines:
    """A LocalTopology that starts nothing."""

    def __init__(self, document: object, state_dir: Path) -> None:
        pass

    def __enter__(self) -> _NoEngines:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _without_engines(monkeypatch: pytest.MonkeyPatch, topology: type, run_leg: Callable[..., Leg]) -> None:
    """The command's run with `topology` for LocalTopology, `run_leg` for the turns, every plugin loading."""
    monkeypatch.setattr("pdx.local.topology.LocalTopology", topology)
    monkeypatch.setattr("pdx.local.gpus.visible_gpus", lambda: [])
    monkeypatch.setattr("tests.e2e.correctness.run_leg", run_leg)
    monkeypatch.setattr("tests.e2e.correctness.entry_points", lambda: dict.fromkeys(PLUGINS, "loads"))
