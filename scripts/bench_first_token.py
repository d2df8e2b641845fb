"""Prefill's first token (router.firstTokenFromPrefill) against decode's, side by side on one set
of engines: the local topology with the switch on (decode has the logits processor, inert for a
request that names no token) and a second router on the same engines with it off, conversations
alternated between the two. Prints, per turn, TTFT p50 and the time from prefill's answer to the
client's first token (TTFT - X-PDX-Router-Ms - X-PDX-Prefill-Ms: decode's hop, or the opening's
write), the gap from the first token to the second (which waits for decode's hop when the first
is prefill's) and to the last, and the ratios of the TTFT p50s.

    .venv/bin/python scripts/bench_first_token.py [-f examples/local-cpu.yaml] [--conversations 8]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pdx.local import default_document  # noqa: E402
from pdx.local.topology import LocalTopology  # noqa: E402
from tests.e2e.test_real_engines import second_router  # noqa: E402


def history(entries: int) -> str:
    return " ".join(f"entry {i}: file {i % 97} holds {i * 13 % 211} lines" for i in range(entries))


def tool_output(rows: int, turn: int) -> str:
    return " ".join(f"row {i}: {(i + turn) * 7 % 53}" for i in range(rows))


@dataclass(frozen=True)
class Turn:
    ttft: float  # ms to the first content
    after_prefill: float  # ttft less the router's and prefill's headers
    second: float  # ms from the first content to the second
    rest: float  # ms from the first content to the end
    outcome: str
    text: str


def turn(url: str, model: str, messages: list[dict[str, str]]) -> Turn:
    """One streamed greedy turn of 16 tokens (min_tokens too, as pdx bench sends)."""
    body = {"model": model, "messages": messages, "max_tokens": 16, "min_tokens": 16, "temperature": 0, "stream": True}
    req = urllib.request.Request(
        url + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    start, text = time.perf_counter(), ""
    arrivals: list[float] = []
    try:
        resp = urllib.request.urlopen(req, timeout=600)
    except urllib.error.HTTPError as err:
        raise SystemExit(f"{url}: {err.code} {err.read()[:500]!r}") from None
    with resp:
        headers = {k.lower(): v for k, v in resp.headers.items()}
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    arrivals.append((time.perf_counter() - start) * 1000)
                    text += piece
    end = (time.perf_counter() - start) * 1000
    before = float(headers.get("x-pdx-router-ms", 0)) + float(headers.get("x-pdx-prefill-ms", 0))
    ttft = arrivals[0]
    second = arrivals[1] - ttft if len(arrivals) > 1 else 0.0
    return Turn(ttft, ttft - before, second, end - ttft, headers.get("x-pdx-reuse", "-"), text)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-f", "--file", type=Path, help="a DisaggregatedInference (default: the embedded local one)")
    p.add_argument("--conversations", type=int, default=8, help="per router, alternated (default 8)")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--history-entries", type=int, default=250, help="first turn's size (~16 tokens an entry)")
    p.add_argument("--tool-rows", type=int, default=150, help="each follow-up's tool output (~8 tokens a row)")
    args = p.parse_args()
    doc: dict[str, Any] = yaml.safe_load(args.file.read_text()) if args.file else copy.deepcopy(default_document())
    spec = doc["spec"]
    spec["kvTransfer"]["bidirectional"] = True
    router = spec.setdefault("router", {})
    router.update(firstTokenFromPrefill=True, reuseHeaders=True, decodeLocalMaxTokens=0, decodeLocalIdleMaxTokens=0)
    rows: dict[str, list[tuple[int, Turn]]] = {"first": [], "decode": []}
    with LocalTopology(doc) as topo, second_router(topo, "--no-first-token-from-prefill") as plain:
        with urllib.request.urlopen(topo.router_url + "/v1/models", timeout=30) as resp:
            model = json.loads(resp.read())["data"][0]["id"]
        turn(topo.router_url, model, [{"role": "user", "content": "warm up"}])
        for c in range(args.conversations):
            pair = [("first", topo.router_url), ("decode", plain)]
            for name, url in pair if c % 2 == 0 else pair[::-1]:
                msgs = [{"role": "user", "content": f"{name} {c}: {history(args.history_entries)}"}]
                for t in range(args.turns):
                    got = turn(url, model, msgs)
                    rows[name].append((t, got))
                    answer = {"role": "assistant", "content": got.text}
                    msgs += [answer, {"role": "user", "content": f"tool {t}: {tool_output(args.tool_rows, t)}"}]
    print("turn  first token  n  TTFT p50  after prefill p50  2nd token after p50  end after p50  outcomes")
    p50: dict[tuple[str, int], float] = {}
    for name, turns in rows.items():
        for t in range(args.turns):
            xs = [r for i, r in turns if i == t]
            p50[name, t] = statistics.median(r.ttft for r in xs)
            after = statistics.median(r.after_prefill for r in xs)
            second = statistics.median(r.second for r in xs)
            rest = statistics.median(r.rest for r in xs)
            outcomes = ",".join(sorted({r.outcome for r in xs}))
            print(
                f"{t + 1:>4}  {name:>11}  {len(xs)}  {p50[name, t]:8.1f}  {after:17.1f}  {second:19.1f}  {rest:13.1f}"
                f"  {outcomes}"
            )
    for t in range(args.turns):
        print(f"turn {t + 1}: TTFT p50 prefill's first token / decode's = {p50['first', t] / p50['decode', t]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
