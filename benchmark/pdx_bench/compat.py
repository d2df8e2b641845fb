"""Compatibility check: vLLM's own multi-turn benchmark against the pdx router, next to pdx's.

It answers two questions with one workload shape: does vLLM's
`benchmarks/multi_turn/benchmark_serving_multi_turn.py --send-conversation-id` work through
the pdx router (its conversation ids drive reuse), and do its `--stats-json-output` records
and pdx's records agree? vLLM's script is taken from the vLLM sdist on PyPI at run time (pip
unpacks it, then fails to build it, which is fine) and run as a separate process; none of
its code is imported or kept in this repository.

Known, documented differences the checks allow for: vLLM's tool counts input tokens over the
message contents (no chat template) where pdx records the engine's `usage.prompt_tokens`,
and it sends no temperature, so its answers (hence the histories) differ from pdx's greedy
ones in content though not in size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp

from .client import run
from .records import VLLM_FIELDS, RequestRecord, write_records
from .workload import HFTokenizerCounter, TokenCounter, WordCounter, Workload, WorkloadSpec, build
from .workload import to_vllm_conversations as vllm_input

VLLM_VERSION = "0.33.0"
SCRIPT = Path("benchmarks/multi_turn/benchmark_serving_multi_turn.py")
# What the script imports beyond this project's dependencies (numpy, aiohttp, transformers,
# tqdm are already installed); installed with --target into a scratch dir, never the venv.
EXTRA_DEPS = ("pandas>=2.2,<3", "pytz", "six")


def cache_dir() -> Path:
    return Path(os.environ.get("PDX_CACHE", Path.home() / ".cache" / "pdx"))


def obtain_sdist(version: str = VLLM_VERSION, cache: Path | None = None, python: str = sys.executable) -> Path:
    """The unpacked vLLM source tree (cached): pip downloads and unpacks it, then fails to build."""
    dest = (cache or cache_dir()) / f"vllm-sdist-{version}"
    if (dest / SCRIPT).is_file():
        return dest
    with tempfile.TemporaryDirectory(prefix="pdx-vllm-sdist-") as tmp:
        env = {**os.environ, "TMPDIR": tmp}
        cmd = [python, "-m", "pip", "download", "--no-clean", "--no-deps", "--no-binary", ":all:"]
        cmd += ["-d", str(Path(tmp) / "dl"), f"vllm=={version}"]
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        found = sorted(Path(tmp).glob(f"pip-download-*/*/{SCRIPT}"))
        if not found:
            raise RuntimeError(f"pip left no vLLM {version} source tree with {SCRIPT} under {tmp}")
        root = found[0].parents[2]
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(dest.name + f".{os.getpid()}")
        shutil.copytree(root / "benchmarks" / "multi_turn", partial / "benchmarks" / "multi_turn")
        partial.replace(dest)
    return dest


def ensure_deps(python: str, target: Path) -> None:
    """Make pandas importable for vLLM's script without touching the project's venv."""
    env = {**os.environ, "PYTHONPATH": str(target)}
    probe = [python, "-c", "import pandas, numpy, transformers, aiohttp, tqdm"]
    if subprocess.run(probe, env=env, capture_output=True, check=False).returncode == 0:
        return
    target.mkdir(parents=True, exist_ok=True)
    cmd = [python, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), *EXTRA_DEPS]
    subprocess.run(cmd, check=True)
    subprocess.run(probe, env=env, check=True)


def run_vllm_benchmark(
    sdist: Path,
    *,
    python: str,
    deps: Path,
    url: str,
    model_dir: Path,
    served_model_name: str,
    conversations: list[dict[str, Any]],
    max_tokens: int,
    out: Path,
    timeout_s: int,
) -> list[dict[str, Any]]:
    """Run vLLM's script, one client, one conversation at a time; returns its records."""
    out.mkdir(parents=True, exist_ok=True)
    input_file = out / "vllm-input.json"
    input_file.write_text(json.dumps(conversations, indent=1))
    stats = out / "vllm-records.json"
    script_dir = sdist / SCRIPT.parent
    cmd = [
        python, str(script_dir / SCRIPT.name),
        "--input-file", str(input_file),
        "--model", str(model_dir),
        "--served-model-name", served_model_name,
        "--url", url.rstrip("/"),
        "--num-clients", "1",
        "--max-active-conversations", "1",
        "--send-conversation-id",
        "--limit-max-tokens", str(max_tokens),
        "--limit-min-tokens", str(max_tokens),
        "--request-timeout-sec", str(timeout_s),
        "--stats-json-output", str(stats),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(deps), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with open(out / "vllm-benchmark.log", "wb") as log:
        proc = subprocess.run(cmd, cwd=script_dir, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0 or not stats.is_file():
        tail = (out / "vllm-benchmark.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"vLLM's benchmark failed (exit {proc.returncode}):\n{tail}")
    data: list[dict[str, Any]] = json.loads(stats.read_text())
    return data


def renamed(workload: Workload, prefix: str) -> Workload:
    """The same conversations under other ids, so neither run finds the other's router entries."""
    convs = [replace(c, conversation_id=f"{prefix}{c.conversation_id}") for c in workload.conversations]
    return Workload(spec=workload.spec, conversations=convs, label=workload.label)


async def router_stats(url: str) -> dict[str, Any] | None:
    try:
        async with (
            aiohttp.ClientSession() as s,
            s.get(url.rstrip("/") + "/v1/pdx/stats", timeout=aiohttp.ClientTimeout(total=10)) as r,
        ):
            if r.status != 200:
                return None
            data: dict[str, Any] = await r.json()
            return data
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


def reuse_delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, int] | None:
    if before is None or after is None:
        return None
    b, a = before.get("reuse", {}), after.get("reuse", {})
    return {k: int(a.get(k, 0)) - int(b.get(k, 0)) for k in a}


# ---------------------------------------------------------------------------- comparison


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool | None  # None: could not be evaluated
    vllm: str
    pdx: str
    rule: str


def _turn_of(rec: dict[str, Any]) -> int:
    # Both tools send user/assistant pairs ending with the new user message: 2 * turn - 1 messages.
    return (int(rec["input_num_turns"]) + 1) // 2


def _median(values: Sequence[float]) -> float:
    present = [v for v in values if v == v]
    return statistics.median(present) if present else float("nan")


def _num(rec: dict[str, Any], key: str) -> float:
    """A numeric field, NaN when absent: a malformed record fails its check, not the run."""
    try:
        return float(rec[key])
    except (KeyError, TypeError, ValueError):
        return float("nan")


def compare(
    vllm_records: Sequence[dict[str, Any]],
    pdx_records: Sequence[dict[str, Any]],
    *,
    conversations: int,
    turns: int,
    max_tokens: int,
    vllm_reuse: dict[str, int] | None,
    ttft_factor: float = 2.0,
) -> list[Check]:
    """Checks that hold when both tools measured the same workload through the same router."""
    want = conversations * turns
    checks = [
        Check("requests answered", len(vllm_records) == want and len(pdx_records) == want,
              str(len(vllm_records)), str(len(pdx_records)), f"both {want}"),
    ]  # fmt: skip
    vkeys = set().union(*(r.keys() for r in vllm_records)) if vllm_records else set()
    pkeys = list(pdx_records[0].keys()) if pdx_records else []
    checks.append(
        Check(
            "record fields",
            bool(vkeys) and vkeys <= set(pkeys) and tuple(pkeys[: len(VLLM_FIELDS)]) == VLLM_FIELDS,
            f"{len(vkeys)} fields",
            f"{len(pkeys)} fields, vLLM's first",
            "every vLLM field present in pdx's records, in vLLM's order",
        )
    )
    v_turns = sorted(_turn_of(r) for r in vllm_records)
    p_turns = sorted(int(r["turn"]) for r in pdx_records)
    checks.append(
        Check("turns per request", v_turns == p_turns and p_turns == sorted(list(range(1, turns + 1)) * conversations),
              _hist(v_turns), _hist(p_turns), "same turn indices (input_num_turns = 2*turn-1)")
    )  # fmt: skip
    v_out = _median([_num(r, "output_num_tokens") for r in vllm_records])
    p_out = _median([_num(r, "output_num_tokens") for r in pdx_records])
    checks.append(
        Check("output tokens (median)", abs(v_out - p_out) <= 0.25 * max_tokens + 1,
              f"{v_out:.0f}", f"{p_out:.0f}", f"within 25% of max_tokens={max_tokens}")
    )  # fmt: skip
    for turn in range(1, turns + 1):
        v_in = _median([_num(r, "input_num_tokens") for r in vllm_records if _turn_of(r) == turn])
        p_in = _median([_num(r, "input_num_tokens") for r in pdx_records if int(r["turn"]) == turn])
        msgs = 2 * turn - 1
        # pdx counts the chat template too (a few tokens per message); histories differ in text.
        slack = 0.15 * v_in + max_tokens * 0.25 * (turn - 1)
        ok = -slack <= p_in - v_in <= 8 * msgs + 4 + slack
        checks.append(
            Check(f"input tokens, turn {turn} (median)", ok, f"{v_in:.0f}", f"{p_in:.0f}",
                  "pdx = vLLM + chat template (<= 8/message), within 15%")
        )  # fmt: skip
    for label, first in (("turn 1", True), ("turns >= 2", False)):
        v_t = _median([_num(r, "ttft_ms") for r in vllm_records if (_turn_of(r) == 1) == first])
        p_t = _median([_num(r, "ttft_ms") for r in pdx_records if (int(r["turn"]) == 1) == first])
        ok = v_t > 0 and p_t > 0 and max(v_t, p_t) <= ttft_factor * min(v_t, p_t)
        checks.append(Check(f"TTFT {label} (median ms)", ok, f"{v_t:.1f}", f"{p_t:.1f}", f"within {ttft_factor}x"))
    follow_ups = conversations * (turns - 1)
    p_hits = sum(1 for r in pdx_records if r.get("reuse") == "hit")
    if vllm_reuse is None:
        checks.append(Check("reuse via conversation_id", None, "router stats unavailable", str(p_hits), "-"))
    else:
        v_hits = vllm_reuse.get("hit", 0)
        ok = follow_ups == 0 or (v_hits > 0 and p_hits > 0 and abs(v_hits - p_hits) <= max(1, follow_ups // 3))
        checks.append(
            Check("reuse hits (follow-up turns)", ok, f"{v_hits}/{follow_ups}", f"{p_hits}/{follow_ups}",
                  "vLLM's --send-conversation-id drives reuse like pdx's client")
        )  # fmt: skip
    return checks


def _hist(values: Sequence[int]) -> str:
    return " ".join(f"t{v}x{values.count(v)}" for v in sorted(set(values)))


def checks_markdown(checks: Sequence[Check]) -> str:
    verdict = {True: "ok", False: "DIFFERS", None: "n/a"}
    lines = ["| check | vLLM benchmark | pdx bench | rule | verdict |", "|---|---:|---:|---|---|"]
    lines += [f"| {c.name} | {c.vllm} | {c.pdx} | {c.rule} | {verdict[c.ok]} |" for c in checks]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- main


def _counter(model_dir: Path) -> TokenCounter:
    if (model_dir / "tokenizer.json").is_file():
        return HFTokenizerCounter.from_file(model_dir)
    return WordCounter()


async def _pdx_run(url: str, model: str, workload: Workload, counter: TokenCounter) -> list[RequestRecord]:
    async with aiohttp.ClientSession() as s:
        res = await run(s, url, model, workload, counter=counter, leg="compat")
    if res.errors:
        raise RuntimeError(f"pdx's client saw {len(res.errors)} failed request(s): {res.errors[:2]}")
    return res.records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pdx_bench.compat", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="pdx router base URL")
    p.add_argument("--model-dir", type=Path, required=True, help="model directory (vLLM's script loads its tokenizer)")
    p.add_argument("--served-model-name", required=True)
    p.add_argument("--vllm-src", type=Path, help="an unpacked vLLM sdist (default: obtained with pip and cached)")
    p.add_argument("--vllm-version", default=VLLM_VERSION)
    p.add_argument("--python", default=sys.executable, help="interpreter for vLLM's script")
    p.add_argument("--out", type=Path, default=Path("bench-results/compat"))
    p.add_argument("--prefix-tokens", type=int, default=1000)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--conversations", type=int, default=2)
    p.add_argument("--user-tokens", type=int, default=64)
    p.add_argument("--tool-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=int, default=300)
    args = p.parse_args(argv)

    counter = _counter(args.model_dir)
    spec = WorkloadSpec(
        prefix_tokens=args.prefix_tokens,
        turns=args.turns,
        conversations=args.conversations,
        user_tokens=args.user_tokens,
        tool_tokens=args.tool_tokens,
        output_tokens=args.output_tokens,
        seed=args.seed,
        system_role=False,  # vLLM's script has no system role: the prefix opens the first user turn
        fixed_output=False,  # it sends max_tokens only
    )
    tag = f"compat-{int(time.time())}"
    workload = build(spec, counter, label=tag)
    sdist = args.vllm_src or obtain_sdist(args.vllm_version, python=args.python)
    deps = cache_dir() / "vllm-bench-deps"
    ensure_deps(args.python, deps)

    before = asyncio.run(router_stats(args.url))
    vllm_records = run_vllm_benchmark(
        sdist,
        python=args.python,
        deps=deps,
        url=args.url,
        model_dir=args.model_dir,
        served_model_name=args.served_model_name,
        conversations=vllm_input(renamed(workload, "vllm-")),
        max_tokens=args.output_tokens,
        out=args.out,
        timeout_s=args.timeout,
    )
    after = asyncio.run(router_stats(args.url))
    pdx_records = asyncio.run(_pdx_run(args.url, args.served_model_name, renamed(workload, "pdx-"), counter))
    write_records(args.out / "pdx-records.json", pdx_records)

    checks = compare(
        vllm_records,
        [r.to_json() for r in pdx_records],
        conversations=args.conversations,
        turns=args.turns,
        max_tokens=args.output_tokens,
        vllm_reuse=reuse_delta(before, after),
    )
    table = checks_markdown(checks)
    (args.out / "compat.md").write_text(f"# vLLM multi-turn benchmark vs pdx bench\n\n{table}\n")
    (args.out / "compat.json").write_text(json.dumps([asdict(c) for c in checks], indent=2) + "\n")
    print(table)
    print(
        f"records: {args.out / 'vllm-records.json'} {args.out / 'pdx-records.json'}; report: {args.out / 'compat.md'}"
    )
    return 0 if all(c.ok is not False for c in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
