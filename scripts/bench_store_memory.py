#!/usr/bin/env python3
"""What a stored conversation costs the router: bytes per stored token, and RSS, per router.

Fake engines run in one subprocess and each router in its own (a real pdx-router on
loopback, default config: memory store). Each conversation is one completions turn whose
prompt is `--tokens` random token ids (as a real vocabulary spreads them, so no small-int
caching flatters a list); decode's answer is stored, one entry per conversation. RSS is read
from /proc before and after; `storeBytes` is the router's own estimate (/v1/pdx/stats), absent
from routers that predate it. With `--baseline-src DIR` another revision's router (e.g. main's
checkout) is measured the same way beside this one, and the prefix check of a 16k-token entry
is timed in each tree's own code.

Before the conversations, `--warmup` turns without a conversation id (nothing stored) give
each router its working set: that RSS is the base of the memory limit the operator derives
(`pdx.rules.ROUTER_BASE_MEMORY_BYTES`; raise `--warmup` and `--concurrency` to load it), and
RSS growth / storeBytes is `pdx.rules.STORE_OVERHEAD_FACTOR`.

    .venv/bin/python scripts/bench_store_memory.py [--conversations 400] [--baseline-src DIR]

DIR is a source tree with router/ and contract/, e.g. `git archive main router contract | tar -x -C DIR`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from pdx.local.topology import free_port

PY = sys.executable
ROOT = Path(__file__).resolve().parents[1]

# Timed in each tree's own code: from /tokenize's JSON answer (an entry of TOKENS held ids, the
# prompt the same ids plus a tail) to the plan, as the router does it on a reused turn.
PREFIX_CHECK = """
import random, timeit, orjson
from pdx_router.entries import Entry
from pdx_router.policy.reuse import plan_reuse
n = {tokens}
ids = [random.randrange(1000, 150000) for _ in range(n)]
kv = {{"remote_block_ids": [list(range(n // 128))], "remote_num_tokens": n, "remote_engine_id": "d"}}
entry = Entry(kv, ids, "http://d", "g", 0.0, 1e12, 128)
answer = orjson.dumps({{"count": n + 3, "max_model_len": 32768, "tokens": ids + [7, 8, 9], "token_strs": None}})
try:
    from pdx_router.upstream import tokenized_ids  # the ids as text
    step = lambda: plan_reuse(entry, tokenized_ids(answer, entry.token_ids), 64)
except ImportError:  # before: parsed into ints, then compared
    step = lambda: plan_reuse(entry, orjson.loads(answer)["tokens"], 64)
assert step().tokens == n
# the best of many short runs: the machine may be shared, and only its quiet moments compare
best = min(timeit.repeat(step, number=20, repeat=100)) / 20
print(best * 1e6)
"""


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            try:
                async with http.get(url) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not answer 200 within {timeout:g} s")


def env_for(src: Path) -> dict[str, str]:
    path = os.pathsep.join(str(src / d) for d in ("router", "contract"))
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


async def turns(url: str, n: int, tokens: int, conversation: bool, concurrency: int) -> None:
    """n completions turns of `tokens` random ids; each with its own conversation id if asked."""
    rng = random.Random(n * 7919 + tokens)
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int, http: aiohttp.ClientSession) -> None:
        body: dict[str, Any] = {
            "model": "m",
            "prompt": [rng.randrange(1000, 150000) for _ in range(tokens)],
            "max_tokens": 4,
        }
        if conversation:
            body["conversation_id"] = f"c{i}"
        async with sem, http.post(url + "/v1/completions", data=orjson.dumps(body)) as r:
            await r.read()
            if r.status != 200:
                raise RuntimeError(f"turn {i}: HTTP {r.status}")

    # An API key: the router's default tenancy stores nothing for a client without an identity.
    headers = {"Content-Type": "application/json", "Authorization": "Bearer bench"}
    async with aiohttp.ClientSession(headers=headers) as http:
        await asyncio.gather(*(one(i, http) for i in range(n)))


async def measure(name: str, src: Path, args: argparse.Namespace, pp: int, dp: int) -> dict[str, Any]:
    port = free_port()
    cfg = {
        "host": "127.0.0.1",
        "port": port,
        "servedModelName": "m",
        "prefill": [f"http://127.0.0.1:{pp}"],
        "decode": [f"http://127.0.0.1:{dp}"],
        "healthCheckIntervalSeconds": 60,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
    proc = subprocess.Popen(
        [PY, "-m", "pdx_router.main", "--config", f.name],
        env=env_for(src),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_http(url + "/ready")
        started = rss_bytes(proc.pid)
        await turns(url, args.warmup, args.tokens, False, args.concurrency)
        base = rss_bytes(proc.pid)
        await turns(url, args.conversations, args.tokens, True, args.concurrency)
        after = rss_bytes(proc.pid)
        async with aiohttp.ClientSession() as http, http.get(url + "/v1/pdx/stats") as r:
            stats = await r.json()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        os.unlink(f.name)
    prefix_us = float(
        subprocess.run(
            [PY, "-c", PREFIX_CHECK.format(tokens=args.tokens)],
            env=env_for(src),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    stored = stats["entries"] * args.tokens
    return {
        "router": name,
        "entries": stats["entries"],
        "rss_start": started,
        "rss_base": base,
        "rss_after": after,
        "rss_per_token": (after - base) / stored if stored else float("nan"),
        "store_bytes": stats.get("storeBytes"),
        "prefix_us": prefix_us,
    }


def report(rows: list[dict[str, Any]], tokens: int) -> None:
    mib = 2**20
    print(f"\n{tokens}-token conversations, one stored entry each")
    print(
        f"{'router':<12} {'entries':>7} {'RSS start':>10} {'RSS base':>9} {'RSS after':>10} "
        f"{'RSS B/token':>11} {'store B/token':>13} {'RSS/store':>9} {'prefix check':>12}"
    )
    for r in rows:
        sb = r["store_bytes"]
        per_store = f"{sb / (r['entries'] * tokens):.2f}" if sb and r["entries"] else "-"
        ratio = f"{(r['rss_after'] - r['rss_base']) / sb:.2f}" if sb else "-"
        print(
            f"{r['router']:<12} {r['entries']:>7} {r['rss_start'] / mib:>8.1f}Mi {r['rss_base'] / mib:>7.1f}Mi "
            f"{r['rss_after'] / mib:>8.1f}Mi {r['rss_per_token']:>11.2f} {per_store:>13} {ratio:>9} "
            f"{r['prefix_us']:>10.0f}us"
        )


async def main_async(args: argparse.Namespace) -> None:
    pp, dp = free_port(), free_port()
    engines = subprocess.Popen(
        [PY, "-m", "pdx_router.testing.fake_engine", "--prefill-port", str(pp), "--decode-port", str(dp)],
        env=env_for(ROOT),
        stdout=subprocess.DEVNULL,
    )
    try:
        await wait_http(f"http://127.0.0.1:{pp}/health")
        await wait_http(f"http://127.0.0.1:{dp}/health")
        rows = []
        if args.baseline_src:
            rows.append(await measure("baseline", Path(args.baseline_src).resolve(), args, pp, dp))
        rows.append(await measure("this", ROOT, args, pp, dp))
    finally:
        engines.terminate()
        engines.wait(timeout=10)
    report(rows, args.tokens)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conversations", type=int, default=400)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--warmup", type=int, default=64, help="turns without a conversation id first (nothing stored)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--baseline-src", help="another revision's source tree (its router/ and contract/)")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
