#!/usr/bin/env python3
"""Added TTFT of pdx-router vs talking to the engines directly, and vs vLLM's example proxy.

Fake engines (fixed delays, real protocol payloads, a real tokenizers word-level tokenizer
with a ChatML template, built here) run in one subprocess, each router in its own, the load generator here.
"pdx-router+tok" is pdx-router with its own tokenizer (--tokenizer): reused turns skip the
/tokenize hop once it has matched the engine on 8 prompts (done in a warm-up pass).
Conversations are multi-turn and streamed; "direct" does the two P/D hops itself, so
(router TTFT - direct TTFT) is what the router adds. The upstream example
proxy is taken from the vLLM sdist on PyPI at run time (never committed) and skipped with a
reason if it cannot be obtained.

    .venv/bin/python scripts/bench_router.py [--turns 5] [--upstream-proxy PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from pdx.local.topology import free_port  # ports no other socket can take first

PY = sys.executable
CACHE = Path(tempfile.gettempdir()) / "pdx-bench-upstream" / "disagg_proxy_multiturn.py"
PLAIN = False  # --plain: no conversation id, so no store and no tokenize hop
THINK_MS = 0.0  # --think-ms: mean pause between a turn's end and the next (agent tool time)
FILLER = " ".join(f"word{i}" for i in range(300))


def get_upstream_proxy(explicit: str | None) -> tuple[Path | None, str]:
    """The example proxy from the vLLM sdist: pip keeps the unpacked tree after failing."""
    if explicit:
        return Path(explicit), "given"
    if CACHE.exists():
        return CACHE, "cached"
    for mod in ("fastapi", "uvicorn", "httpx"):
        try:
            __import__(mod)
        except ImportError:
            return None, f"{mod} is not installed (pip install fastapi uvicorn httpx)"
    tmp = tempfile.mkdtemp(prefix="pdx-bench-sdist-")
    try:
        subprocess.run(
            [PY, "-m", "pip", "download", "--no-clean", "--no-deps", "--no-binary", ":all:", "vllm==0.33.0", "-d", tmp],
            env={**os.environ, "TMPDIR": tmp},
            capture_output=True,
            timeout=150,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, "pip download of the vLLM sdist timed out"
    found = glob.glob(f"{tmp}/pip-download-*/*/examples/disaggregated/disaggregated_serving/disagg_proxy_multiturn.py")
    if not found:
        shutil.rmtree(tmp, ignore_errors=True)
        return None, "the vLLM sdist did not contain the example proxy (or PyPI unreachable)"
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(found[0], CACHE)
    shutil.rmtree(tmp, ignore_errors=True)
    return CACHE, "downloaded"


async def wait_http(url: str, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    async with aiohttp.ClientSession() as s:
        while time.time() < deadline:
            try:
                async with s.get(url) as r:
                    if r.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


Turn = Callable[[aiohttp.ClientSession, dict[str, Any]], Awaitable[float]]


async def first_token(resp: aiohttp.ClientResponse, t0: float) -> float:
    """Time to the first chunk that carries generated text; drains the rest."""
    ttft = 0.0
    async for line in resp.content:
        if not ttft and line.startswith(b"data: {") and b'"content":"' in line and b'"content":""' not in line:
            ttft = time.perf_counter() - t0
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}")
    return ttft


def via_proxy(url: str) -> Turn:
    async def turn(s: aiohttp.ClientSession, body: dict[str, Any]) -> float:
        t0 = time.perf_counter()
        async with s.post(
            url + "/v1/chat/completions", data=orjson.dumps(body), headers={"Content-Type": "application/json"}
        ) as r:
            return await first_token(r, t0)

    return turn


def direct(prefill: str, decode: str) -> Turn:
    """The client does both hops itself: the floor any router is measured against."""

    async def turn(s: aiohttp.ClientSession, body: dict[str, Any]) -> float:
        t0 = time.perf_counter()
        b = {k: v for k, v in body.items() if k != "conversation_id"}
        p = {
            **b,
            "stream": False,
            "max_tokens": 1,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
        }
        async with s.post(prefill + "/v1/chat/completions", data=orjson.dumps(p)) as r:
            kv = orjson.loads(await r.read())["kv_transfer_params"]
        async with s.post(decode + "/v1/chat/completions", data=orjson.dumps({**b, "kv_transfer_params": kv})) as r:
            return await first_token(r, t0)

    return turn


async def conversation(s: aiohttp.ClientSession, turn: Turn, cid: str, turns: int, out: list[float]) -> None:
    msgs: list[dict[str, str]] = [{"role": "user", "content": f"{cid} {FILLER}"}]
    rng = random.Random(cid)
    for i in range(turns):
        if THINK_MS:
            # Exponential pauses, seeded per conversation so every target sees the same ones.
            await asyncio.sleep(rng.expovariate(1000 / THINK_MS))
        body: dict[str, Any] = {"model": "Qwen", "messages": msgs, "stream": True, "max_tokens": 16}
        if not PLAIN:
            body["conversation_id"] = cid
        out.append(await turn(s, body))
        msgs = [*msgs, {"role": "assistant", "content": f"answer {i}"}, {"role": "user", "content": f"question {i}"}]


async def run(turn: Turn, conc: int, turns: int, tag: str) -> tuple[list[float], float]:
    ttfts: list[float] = []
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as s:
        # Warm at the measured concurrency: every hop then has its keep-alive connections,
        # and the first measured turn does not time TCP connects (the router makes one more
        # per conversation than a direct client, which a long-running router never pays).
        await asyncio.gather(*(conversation(s, turn, f"warm-{tag}-{conc}-{i}", 2, []) for i in range(conc)))
        t0 = time.perf_counter()
        await asyncio.gather(*(conversation(s, turn, f"{tag}-{conc}-{i}", turns, ttfts) for i in range(conc)))
        wall = time.perf_counter() - t0
    return ttfts, len(ttfts) / wall


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (Linux /proc): the router's cost per turn."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))] * 1000


def router_cmd(port: int, prefill: int, decode: int, *extra: str) -> list[str]:
    return [
        PY,
        "-m",
        "pdx_router.main",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--prefill",
        f"http://127.0.0.1:{prefill}",
        "--decode",
        f"http://127.0.0.1:{decode}",
        "--model",
        "Qwen",
        "--log-level",
        "WARNING",
        *extra,
    ]


def bench_tokenizer(root: Path) -> str:
    """A word-level tokenizer for the benchmark's words: fast enough (~0.2 ms per prompt) that
    the fake engines stay cheap, and a real tokenizer.json that pdx-router loads as it would a model's."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    from pdx.local.localmodel import CHAT_TEMPLATE

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # <|im_end|> = 2, the fakes' EOS
    words = [*specials, "[UNK]", "user", "assistant", "system", "answer", "question"]
    words += [f"word{i}" for i in range(300)] + [f"w{i}" for i in range(50)] + [str(i) for i in range(1000)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    root.mkdir(parents=True, exist_ok=True)
    tok.save(str(root / "tokenizer.json"))
    config = {"chat_template": CHAT_TEMPLATE, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    (root / "tokenizer_config.json").write_text(orjson.dumps(config).decode())
    return str(root)


async def main_async(args: argparse.Namespace) -> None:
    tok_dir = Path(tempfile.mkdtemp(prefix="pdx-bench-tok-"))
    model = bench_tokenizer(tok_dir)
    procs: list[subprocess.Popen[bytes]] = []
    pp, dp, rp, tp, up = free_port(), free_port(), free_port(), free_port(), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        procs.append(
            subprocess.Popen(
                [
                    PY,
                    "-m",
                    "pdx_router.testing.fake_engine",
                    "--prefill-port",
                    str(pp),
                    "--decode-port",
                    str(dp),
                    "--prefill-delay",
                    str(args.prefill_ms / 1000),
                    "--tokenizer",
                    model,
                ],
                env=env,
                stdout=subprocess.DEVNULL,
            )
        )
        procs.append(subprocess.Popen(router_cmd(rp, pp, dp), env=env, stdout=subprocess.DEVNULL))
        pids = {"pdx-router": procs[-1].pid}
        procs.append(subprocess.Popen(router_cmd(tp, pp, dp, "--tokenizer", model), env=env, stdout=subprocess.DEVNULL))
        pids["pdx-router+tok"] = procs[-1].pid
        targets: dict[str, Turn] = {"direct": direct(f"http://127.0.0.1:{pp}", f"http://127.0.0.1:{dp}")}
        if args.baseline_src:
            # Another revision's router, from its source tree, beside this one in the same run.
            src = Path(args.baseline_src).resolve()
            base_env = {**env, "PYTHONPATH": os.pathsep.join(str(src / d) for d in ("router", "contract"))}
            bp = free_port()
            procs.append(subprocess.Popen(router_cmd(bp, pp, dp), env=base_env, stdout=subprocess.DEVNULL))
            pids["pdx-router@base"] = procs[-1].pid
            targets["pdx-router@base"] = via_proxy(f"http://127.0.0.1:{bp}")
        targets |= {
            "pdx-router": via_proxy(f"http://127.0.0.1:{rp}"),
            "pdx-router+tok": via_proxy(f"http://127.0.0.1:{tp}"),
        }
        engines_pid = procs[0].pid
        path, why = get_upstream_proxy(args.upstream_proxy)
        if path is not None:
            procs.append(
                subprocess.Popen(
                    [
                        PY,
                        str(path),
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(up),
                        "--prefiller-host",
                        "127.0.0.1",
                        "--prefiller-port",
                        str(pp),
                        "--decoder-host",
                        "127.0.0.1",
                        "--decoder-port",
                        str(dp),
                    ],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            targets["vllm-example"] = via_proxy(f"http://127.0.0.1:{up}")
            pids["vllm-example"] = procs[-1].pid
        else:
            print(f"(c) vLLM example proxy skipped: {why}")
        await wait_http(f"http://127.0.0.1:{pp}/health")
        await wait_http(f"http://127.0.0.1:{rp}/ready")
        await wait_http(f"http://127.0.0.1:{tp}/ready")
        if args.baseline_src:
            await wait_http(f"http://127.0.0.1:{bp}/ready")
        if "vllm-example" in targets:
            try:
                await wait_http(f"http://127.0.0.1:{up}/health")
            except RuntimeError:
                print("(c) vLLM example proxy skipped: it did not start")
                del targets["vllm-example"]
        print(
            f"fake engines: prefill {args.prefill_ms} ms, decode 5 ms to first token, "
            f"2 ms/token, 16 tokens; {args.turns} streamed turns per conversation"
            + (f", mean think time {THINK_MS:g} ms" if THINK_MS else ", no think time (lockstep)")
            + "\n"
        )
        # Probation: the router's tokenizer must match the engine on 8 whole prompts first.
        await run(targets["pdx-router+tok"], 8, 1, "probation")
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{tp}/v1/pdx/stats") as r:
            state = (await r.json())["routerTokenizer"]
        print(f"pdx-router+tok: its tokenizer is {state} after the warm-up")
        head = (
            f"{'conc':>4} {'target':<13} {'TTFT p50':>9} {'p99':>8} {'added p50':>10} {'added p99':>10} "
            f"{'req/s':>7} {'CPU ms/turn':>11} {'cores busy':>10}"
        )
        print(head)
        print("-" * len(head))
        for conc in args.concurrency:
            base: tuple[float, float] | None = None
            for name, turn in targets.items():
                if args.only and name not in args.only and name != "direct":
                    continue
                pid = pids.get(name)
                cpu0 = cpu_seconds(pid) if pid else 0.0
                # The whole machine's share: load generator + fake engines + the proxy under test.
                busy0 = cpu_seconds(os.getpid()) + cpu_seconds(engines_pid) + cpu0
                wall0 = time.perf_counter()
                ttfts, rps = await run(turn, conc, args.turns, name)
                cpu1 = cpu_seconds(pid) if pid else 0.0
                busy = (cpu_seconds(os.getpid()) + cpu_seconds(engines_pid) + cpu1 - busy0) / (
                    time.perf_counter() - wall0
                )
                # Includes the warm-up turns (2 per conversation) the run also sent.
                cpu = f"{(cpu1 - cpu0) * 1000 / (len(ttfts) + 2 * conc):>11.3f}" if pid else f"{'':>11}"
                p50, p99 = pct(ttfts, 0.5), pct(ttfts, 0.99)
                if base is None:
                    base = (p50, p99)
                added = "" if name == "direct" else f"{p50 - base[0]:>+10.2f} {p99 - base[1]:>+10.2f}"
                print(f"{conc:>4} {name:<13} {p50:>9.2f} {p99:>8.2f} {added:>21} {rps:>7.1f} {cpu} {busy:>10.2f}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tok_dir, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--prefill-ms", type=float, default=20.0)
    ap.add_argument("--upstream-proxy", help="path to disagg_proxy_multiturn.py (skips download)")
    ap.add_argument("--plain", action="store_true", help="send no conversation id")
    ap.add_argument("--only", nargs="+", help="targets to run besides direct (default: all)")
    ap.add_argument("--think-ms", type=float, default=0.0, help="mean pause between turns (default: none)")
    ap.add_argument(
        "--baseline-src",
        help="source tree of another revision (git worktree add DIR REV): its router runs as pdx-router@base",
    )
    args = ap.parse_args()
    global PLAIN, THINK_MS
    PLAIN, THINK_MS = args.plain, args.think_ms
    # A killed benchmark still stops its engines and proxies (the finally in main_async).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
