#!/usr/bin/env python3
"""Where the prompt ids of a reused turn come from, and what each source costs in TTFT, on
real vLLM CPU engines (issue 19, item 3).

Three variants of the embedded local CR, each one `pdx bench --local` leg with reuse on,
alternated over reps so that drift favours none:

- `router-tok`: engines without pdx's prefix-check plugin; the router tokenizes reused turns
  itself (`router.tokenizer: router`, after its 8-prompt probation);
- `engine-tok`: engines without the plugin; the router asks prefill's `/tokenize`;
- `plugin`: the default; the engines check the prefix, the router asks nobody for ids.

The plugin is left out by naming the others in `VLLM_PLUGINS` (vLLM loads only those).
Per variant and prefix length: TTFT p50/p90 of the reused turns, and TTFT minus the prefill
hop (the router's `X-PDX-Prefill-Ms`), which holds the planning (tokenizing) and decode's
first token.

    .venv/bin/python scripts/bench_tokenizer_modes.py [--reps 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import yaml

from pdx.local import default_document

CHECK = "pdx_prefix_check"  # the engine plugin's entry point (pyproject.toml)


def without_check() -> str:
    """VLLM_PLUGINS naming pdx's other engine plugins, as installed: all but the check."""
    ours = [e.name for e in entry_points(group="vllm.general_plugins") if e.value.startswith("pdx_engine.")]
    return ",".join(name for name in ours if name != CHECK)


def variant(name: str) -> dict[str, Any]:
    doc = copy.deepcopy(default_document())
    spec = doc["spec"]
    if name != "plugin":
        plugins = without_check()
        for role in ("prefill", "decode"):
            spec.setdefault(role, {}).setdefault("env", {})["VLLM_PLUGINS"] = plugins
    spec.setdefault("router", {})["tokenizer"] = "engine" if name == "engine-tok" else "router"
    return doc


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))] if xs else float("nan")


def report(out: Path) -> list[str]:
    lines = []
    for d in sorted(p for p in out.glob("r*-*") if (p / "records-on.json").is_file()):
        hits = [r for r in json.loads((d / "records-on.json").read_text()) if r["reuse"] == "hit"]
        stats = json.loads((d / "summary.json").read_text())["router_stats"]
        cells = []
        for prefix in sorted({r["prefix_tokens"] for r in hits}):
            rr = [r for r in hits if r["prefix_tokens"] == prefix]
            ttft = [r["ttft_ms"] for r in rr]
            rest = [r["ttft_ms"] - r["prefill_ms"] for r in rr]
            cells.append(
                f"{prefix}: n={len(rr)} TTFT p50 {pct(ttft, 0.5):.0f} p90 {pct(ttft, 0.9):.0f}, "
                f"minus prefill p50 {pct(rest, 0.5):.1f} ms"
            )
        lines.append(f"{d.name:<14} ids {stats.get('on', stats)['promptIds']}  " + " | ".join(cells))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default="out/tokenizer-modes")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for rep in range(1, args.reps + 1):
        for name in ("router-tok", "engine-tok", "plugin"):
            cr = out / f"{name}.yaml"
            cr.write_text(yaml.safe_dump(variant(name), sort_keys=False))
            cmd = [str(Path(sys.executable).parent / "pdx"), "bench", "--local", "-f", str(cr), "--legs", "on"]
            cmd += ["--lengths", "2000,4000", "--turns", str(args.turns), "--conversations", str(args.conversations)]
            cmd += ["--concurrency", str(args.concurrency), "--seed", "11", "--out", str(out / f"r{rep}-{name}")]
            cmd += ["--state-dir", str(out / f"state-{name}")]
            print(f"rep {rep}: {name}", flush=True)
            with (out / f"r{rep}-{name}.log").open("w") as log:
                subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True)
    print("\n".join(report(out)))


if __name__ == "__main__":
    main()
