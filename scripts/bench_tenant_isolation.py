#!/usr/bin/env python3
"""What per-tenant caches cost (issue 44): the CPU demo's workload from several tenants sharing one
system prompt, with `router.tenancy.cacheIsolation` `tenant` and `shared`, side by side in one run,
on real vLLM CPU engines (the local topology: examples/local-cpu.yaml's engines, tenants told apart
by API key).

    .venv/bin/python scripts/bench_tenant_isolation.py [--tenants 3] [--conversations 2]
        [--lengths 1000,2000,4000] [--prefill-cache on,off] [--out DIR]

The workload is `pdx bench --local`'s (pdx_bench.workload: one system prompt of each length shared
by every conversation, 4 turns, 64 user + 192 tool tokens a follow-up, 32 output tokens, texts cut
by the local model's tokenizer); its conversations go to the tenants in turn (conversation c to
tenant c mod T, each with its own API key), and the client sends turn 1 of every conversation,
then turn 2 of every one, and so on, one request at a time. For each prefill cache setting
(`on`: prefill's prefix cache, the `production` profile's default; `off`: the demo CR's
`benchmark` profile) one topology runs every length under both isolations, restarting only the
router between them (the operator rolls only the router's Deployment for this field), in
alternating order (drift on a shared machine then hits both alike), each block with texts of its
own (same sizes), so no block finds another's prompts in an engine's prefix or tokenize cache.

Per request: TTFT (first content chunk, as `pdx bench`), the router's X-PDX-Reuse outcome, and
the difference of each engine's `vllm:prefix_cache_queries_total` / `_hits_total` around it. The
table (printed and written to OUT/README.md, with every request in OUT/records.json): first-turn
and follow-up TTFT p50/p90 per leg, the share of prompt tokens each engine found in its prefix
cache (prefill, decode; first turns, follow-ups), and the router's outcomes for follow-ups.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

ROOT = Path(__file__).resolve().parent.parent
QUERIES, HITS = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
ISOLATIONS = ("tenant", "shared")


@dataclass
class Request:
    prefill_cache: str
    isolation: str
    length: int
    tenant: int
    conversation: int
    turn: int
    ttft_ms: float
    latency_ms: float
    prompt_tokens: int
    reuse: str
    # per engine role: (queries, hits) in tokens around this request
    cache: dict[str, tuple[float, float]] = field(default_factory=dict)


def counter(url: str, name: str) -> float:
    """Sum of one counter's series on an engine's /metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def cache_counts(engines: dict[str, list[str]]) -> dict[str, tuple[float, float]]:
    return {
        role: (sum(counter(u, QUERIES) for u in urls), sum(counter(u, HITS) for u in urls))
        for role, urls in engines.items()
    }


@dataclass
class Reply:
    text: str
    ttft_ms: float
    latency_ms: float
    prompt_tokens: int
    reuse: str


def chat(router: str, body: dict[str, Any], api_key: str, conversation_id: str) -> Reply:
    """One streamed turn through the router, as `tenant` `api_key`."""
    headers = {
        "Content-Type": "application/json",
        "Authorization": f"Bearer {api_key}",
        "X-Session-ID": conversation_id,
    }
    req = urllib.request.Request(f"{router}/v1/chat/completions", data=orjson.dumps(body), headers=headers)
    start = time.perf_counter()
    ttft, prompt_tokens, text = -1.0, 0, []
    with urllib.request.urlopen(req, timeout=600) as resp:
        reuse = resp.headers.get("X-PDX-Reuse", "")
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            chunk = orjson.loads(line[5:])
            if "error" in chunk:
                raise RuntimeError(f"the turn failed: {chunk['error']}")
            if chunk.get("usage"):
                prompt_tokens = chunk["usage"]["prompt_tokens"]
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    ttft = ttft if ttft >= 0 else (time.perf_counter() - start) * 1000
                    text.append(piece)
    if ttft < 0:
        raise RuntimeError("the stream ended without content")
    return Reply("".join(text), ttft, (time.perf_counter() - start) * 1000, prompt_tokens, reuse)


def document(prefill_cache: bool, path: Path | None = None) -> dict[str, Any]:
    """The local CR (`path`, else examples/local-cpu.yaml, embedded in pdx), tenants by API key."""
    from pdx.local import default_document

    doc = copy.deepcopy(default_document()) if path is None else yaml.safe_load(path.read_text())
    spec = doc["spec"]
    spec.setdefault("router", {})["tenancy"] = {"identity": "apiKey", "cacheIsolation": "tenant"}
    spec["router"]["reuseHeaders"] = True
    spec.setdefault("prefill", {})["prefixCaching"] = prefill_cache
    return doc


def with_isolation(doc: dict[str, Any], isolation: str) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["spec"]["router"]["tenancy"]["cacheIsolation"] = isolation
    return out


def run_block(
    topo: Any, args: argparse.Namespace, prefill_cache: str, isolation: str, length: int, counter_: Any
) -> list[Request]:
    from pdx_bench.workload import WorkloadSpec, build

    spec = WorkloadSpec(
        prefix_tokens=length,
        turns=args.turns,
        conversations=args.tenants * args.conversations,
        output_tokens=args.output_tokens,
        text_salt=f":{prefill_cache}:{isolation}",
    )
    work = build(spec, counter_, label=f"{prefill_cache}-{isolation}")
    answers: list[list[str]] = [[] for _ in work.conversations]
    out: list[Request] = []
    engines = topo.engine_urls
    for turn in range(1, args.turns + 1):
        for c, conv in enumerate(work.conversations):
            body: dict[str, Any] = {
                "model": args.model,
                "messages": conv.messages_for(turn, answers[c]),
                "stream": True,
                "stream_options": {"include_usage": True},
                "temperature": 0,
                "max_tokens": conv.max_tokens,
                "conversation_id": conv.conversation_id,
            }
            if conv.min_tokens is not None:
                body["min_tokens"] = conv.min_tokens
            tenant = c % args.tenants
            before = cache_counts(engines)
            reply = chat(topo.router_url, body, f"tenant-{tenant}", conv.conversation_id)
            after = cache_counts(engines)
            answers[c].append(reply.text)
            cache = {r: (after[r][0] - before[r][0], after[r][1] - before[r][1]) for r in engines}
            out.append(
                Request(
                    prefill_cache=prefill_cache,
                    isolation=isolation,
                    length=length,
                    tenant=tenant,
                    conversation=c,
                    turn=turn,
                    ttft_ms=reply.ttft_ms,
                    latency_ms=reply.latency_ms,
                    prompt_tokens=reply.prompt_tokens,
                    reuse=reply.reuse,
                    cache=cache,
                )
            )
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def median(values: list[float]) -> str:
    return f"{statistics.median(values):.0f}" if values else "-"


def hit_share(reqs: list[Request], role: str) -> str:
    queries = sum(r.cache.get(role, (0.0, 0.0))[0] for r in reqs)
    hits = sum(r.cache.get(role, (0.0, 0.0))[1] for r in reqs)
    return f"{100 * hits / queries:.0f}%" if queries else "-"


HEADERS = (
    "prefill cache",
    "isolation",
    "first turns finding the system prompt",
    "first-turn TTFT p50 / p90 ms",
    "first-turn TTFT p50, found / not",
    "follow-up TTFT p50 / p90 ms",
    "prefill hits: first / follow-up",
    "decode hits: first / follow-up",
    "router, follow-ups",
)


def rows(records: list[Request], by_length: bool) -> list[tuple[str, ...]]:
    keys = sorted({(r.prefill_cache, r.length if by_length else 0, r.isolation) for r in records},
                  key=lambda k: (k[0] != "on", k[1], ISOLATIONS.index(k[2])))  # fmt: skip
    out: list[tuple[str, ...]] = []
    for cache, length, iso in keys:
        group = [r for r in records if (r.prefill_cache, r.isolation) == (cache, iso) and length in (0, r.length)]
        first = [r for r in group if r.turn == 1]
        follow = [r for r in group if r.turn > 1]
        outcomes = Counter(r.reuse or "-" for r in follow)
        ft, fu = [r.ttft_ms for r in first], [r.ttft_ms for r in follow]
        # a first turn found the system prompt when decode's prefix cache held half its length
        hit = [r for r in first if r.cache.get("decode", (0.0, 0.0))[1] >= r.length / 2]
        cold = [r.ttft_ms for r in first if r not in hit]
        out.append(
            (
                cache + (f", {length}" if by_length else ""),
                iso,
                f"{len(hit)} of {len(first)}",
                f"{statistics.median(ft):.0f} / {pct(ft, 0.9):.0f}",
                f"{median([r.ttft_ms for r in hit])} / {median(cold)}",
                f"{statistics.median(fu):.0f} / {pct(fu, 0.9):.0f}",
                f"{hit_share(first, 'prefill')} / {hit_share(follow, 'prefill')}",
                f"{hit_share(first, 'decode')} / {hit_share(follow, 'decode')}",
                ", ".join(f"{k} {n}" for k, n in sorted(outcomes.items())),
            )
        )
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-f", "--file", type=Path, help="the local CR (default: examples/local-cpu.yaml, embedded)")
    p.add_argument("--tenants", type=int, default=3)
    p.add_argument("--conversations", type=int, default=2, help="conversations per tenant")
    p.add_argument("--lengths", default="1000,2000,4000", help="system prompt tokens, a block each")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--prefill-cache", default="on,off", help="prefill's prefix cache: on and/or off (a topology each)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "cpu-2026-12-05-tenant-isolation")
    args = p.parse_args()
    lengths = [int(v) for v in args.lengths.split(",")]
    settings = [v.strip() for v in args.prefill_cache.split(",") if v.strip()]
    if any(s not in ("on", "off") for s in settings) or args.tenants < 2:
        p.error("--prefill-cache takes on and/or off; --tenants at least 2")

    from pdx.local.topology import LocalTopology
    from pdx_bench.report import markdown
    from pdx_bench.workload import HFTokenizerCounter

    records: list[Request] = []
    started, load = time.time(), [Path("/proc/loadavg").read_text().split()[0]]
    for setting in settings:
        doc = document(setting == "on", args.file)
        args.model = doc["spec"]["model"].get("servedModelName") or "pdx-tiny"
        state = Path(tempfile.mkdtemp(prefix=f"pdx-tenants-{setting}-"))
        with LocalTopology(with_isolation(doc, "tenant"), state_dir=state) as topo:
            counter_ = HFTokenizerCounter.from_file(Path(topo.model_dir))
            running = "tenant"
            warm = {"model": args.model, "messages": [{"role": "user", "content": "warm up " * 200}],
                    "stream": True, "max_tokens": 8, "temperature": 0}  # fmt: skip
            chat(topo.router_url, warm, "warmup", "warmup")
            for i, length in enumerate(lengths):
                order = ISOLATIONS if i % 2 == 0 else ISOLATIONS[::-1]
                for iso in order:
                    if iso != running:
                        topo.reconfigure_router(with_isolation(doc, iso))
                        running = iso
                    t0 = time.time()
                    block = run_block(topo, args, setting, iso, length, counter_)
                    records += block
                    load.append(Path("/proc/loadavg").read_text().split()[0])
                    print(
                        f"prefill cache {setting}, {iso:6}, {length:5} tokens: {len(block)} requests in "
                        f"{time.time() - t0:.0f} s",
                        file=sys.stderr,
                        flush=True,
                    )
    wall = time.time() - started
    table_all = markdown(HEADERS, rows(records, by_length=False))
    table_lengths = markdown(HEADERS, rows(records, by_length=True))
    print(table_all)
    print()
    print(table_lengths)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "records.json").write_text(json.dumps([asdict(r) for r in records], indent=1) + "\n")
    (args.out / "tables.md").write_text(
        f"All lengths ({', '.join(map(str, lengths))} system prompt tokens):\n\n{table_all}\n\n"
        f"By prefill cache setting and length:\n\n{table_lengths}\n\n"
        f"{args.tenants} tenants x {args.conversations} conversations x {args.turns} turns a block; "
        f"wall time {wall:.0f} s; 1-min load average at the start and after each block: {', '.join(load)}\n"
    )
    print(f"wrote {args.out / 'tables.md'} and {args.out / 'records.json'} ({wall:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
