#!/usr/bin/env python3
"""pdx-router's cost beside the routers a platform team would otherwise pick, in one run.

Rows: "direct" (the client does both P/D hops itself: the floor), pdx-router plain (no
conversation id) and with multi-turn reuse ("pdx-reuse", on engines that check the prefix as
the pdx engine plugin does), the same router checking the prefix itself on engines without the
plugin ("pdx/tok-reuse": /tokenize's ids; "pdx+tok-reuse": its own tokenizer's), vllm-router
and smg (the Rust P/D routers, PyPI), and vLLM's example proxy; with --pure-row, pdx-router
plain on its pure-Python data path ("pdx/pure", beside the compiled one). Same fake engines (fixed
delays, real protocol payloads, a real word-level `tokenizers` tokenizer with a ChatML
template, built here), same load generator: agent-shaped conversations whose history grows
from 2-6k to about 8k tokens, 48 streamed tokens a turn, in lockstep at each concurrency.

Per row: TTFT p50/p99 and what the router adds to direct's, req/s, the router's CPU per
request (its process tree's threads' run time from schedstat, minus its own idle cost measured
before the load), CPU per relayed SSE chunk, and the fakes' CPU share and event-loop lag (if the lag grows, the
fakes are the bottleneck, not the router).

The peers are installed at run time into their own venv (--peers-venv, default
~/.cache/pdx/peers/venv; never committed); a peer that cannot be installed or started is a
row saying why. The example proxy comes from the vLLM sdist, likewise at run time.

    .venv/bin/python scripts/bench_router.py [--turns 5] [--reps 2] [--baseline-src DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from pdx.local.topology import free_port  # ports no other socket can take first

PY = sys.executable
CACHE = Path(tempfile.gettempdir()) / "pdx-bench-upstream" / "disagg_proxy_multiturn.py"
THINK_MS = 0.0  # --think-ms: mean pause between a turn's end and the next (agent tool time)
OUTPUT_TOKENS = 48  # --output-tokens: streamed tokens a turn
PEERS = Path.home() / ".cache" / "pdx" / "peers" / "venv"
PEER_PINS = ("vllm-router==0.1.17", "smg==1.13.0")


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


Turn = Callable[[aiohttp.ClientSession, dict[str, Any]], Awaitable[tuple[float, int, str]]]


async def first_token(resp: aiohttp.ClientResponse, t0: float) -> tuple[float, int, str]:
    """Time to the first chunk that carries generated text, the SSE events relayed, and the
    answer's text (what a client sends back next turn)."""
    ttft, chunks, text = 0.0, 0, []
    async for line in resp.content:
        if line.startswith(b"data:"):
            chunks += 1
            if b'"content":"' in line and b'"content":""' not in line:
                if not ttft:
                    ttft = time.perf_counter() - t0
                for c in orjson.loads(line[5:])["choices"]:
                    text.append((c.get("delta") or {}).get("content") or "")
    if resp.status != 200 or not ttft:
        raise RuntimeError(f"HTTP {resp.status}, {chunks} events, no content")
    return ttft, chunks, "".join(text)


def via_proxy(url: str) -> Turn:
    async def turn(s: aiohttp.ClientSession, body: dict[str, Any]) -> tuple[float, int]:
        t0 = time.perf_counter()
        async with s.post(
            url + "/v1/chat/completions", data=orjson.dumps(body), headers={"Content-Type": "application/json"}
        ) as r:
            return await first_token(r, t0)

    return turn


def direct(prefill: str, decode: str) -> Turn:
    """The client does both hops itself: the floor any router is measured against."""

    async def turn(s: aiohttp.ClientSession, body: dict[str, Any]) -> tuple[float, int]:
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


def agent_history(rng: random.Random) -> list[str]:
    """An agent's context: a long first prompt (system, tools, files: 2-6k words), then each
    turn a tool result of 200-500 words. Words of the bench tokenizer: one token each."""
    return [f"word{rng.randrange(300)}" for _ in range(rng.randint(2000, 6000))]


async def conversation(
    s: aiohttp.ClientSession,
    turn: Turn,
    cid: str,
    turns: int,
    out: list[float],
    chunks: list[int],
    reuse: bool,
    history: bool = False,
) -> None:
    """`reuse`: the turns name their conversation by its id. `history`: by nothing but the
    answers sent back as they came (the router finds the conversation by its history);
    otherwise each answer is sent back as a placeholder, so the history finds nothing."""
    # Every target sees the same histories, each behind its own first word: the fakes memoise
    # tokenization by text, so a history one target sent before would be cheaper for the next.
    # The seed is the id's last two parts (concurrency, index): a target's name may hold a "-".
    rng = random.Random("-".join(cid.rsplit("-", 2)[-2:]))
    msgs: list[dict[str, str]] = [{"role": "user", "content": cid + " " + " ".join(agent_history(rng))}]
    for i in range(turns):
        if THINK_MS:
            # Exponential pauses, seeded per conversation so every target sees the same ones.
            await asyncio.sleep(rng.expovariate(1000 / THINK_MS))
        body: dict[str, Any] = {"model": "Qwen", "messages": msgs, "stream": True, "max_tokens": OUTPUT_TOKENS}
        if reuse:
            body["conversation_id"] = cid
        ttft, n, text = await turn(s, body)
        out.append(ttft)
        chunks.append(n)
        tool = " ".join(f"word{rng.randrange(300)}" for _ in range(rng.randint(200, 500)))
        said = text if history else f"answer {i}"
        msgs = [*msgs, {"role": "assistant", "content": said}, {"role": "user", "content": tool}]


async def run(
    turn: Turn, conc: int, turns: int, tag: str, reuse: bool, conversations: int = 0, history: bool = False
) -> tuple[list[float], list[int], float]:
    """`conc` conversations at a time, `max(conc, conversations)` in all: a row at concurrency
    1 then times as many requests as one at 8 (10 requests read +-15% between reps)."""
    ttfts: list[float] = []
    chunks: list[int] = []
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as s:
        # Warm at the measured concurrency: every hop then has its keep-alive connections,
        # and the first measured turn does not time TCP connects (the router makes one more
        # per conversation than a direct client, which a long-running router never pays).
        await asyncio.gather(*(conversation(s, turn, f"warm{tag}-{i}", 2, [], [], reuse, history) for i in range(conc)))
        t0 = time.perf_counter()
        total = max(conc, conversations)

        async def lane(first: int) -> None:  # one of `conc`: its conversations one after another
            for i in range(first, total, conc):
                await conversation(s, turn, f"{tag}-{i}", turns, ttfts, chunks, reuse, history)

        await asyncio.gather(*(lane(i) for i in range(conc)))
        wall = time.perf_counter() - t0
    return ttfts, chunks, len(ttfts) / wall


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def tree_cpu(pid: int, system_only: bool = False) -> float:
    """User + system CPU of a process and its descendants so far (Linux /proc; all threads,
    and reaped children's): what a router costs, whatever it spawns. `system_only`: the
    kernel's part (the socket calls), to tell it from the router's own code."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            f = _stat(p)
            total += int(f[12]) + int(f[14]) if system_only else int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


class ThreadClock:
    """CPU of process trees in nanoseconds: each thread's run time from its schedstat (the
    ticks of /proc/PID/stat are 10 ms apart: a row of 80 requests at 3 ms each would read
    +-4%). A thread that ends keeps what it was last seen at; `watch` samples often enough
    that little of it is lost (a tokio blocking thread ends after 10 s idle)."""

    def __init__(self) -> None:
        self.seen: dict[int, dict[int, int]] = {}  # root pid -> thread id -> ns

    def cpu(self, pid: int) -> float:
        threads = self.seen.setdefault(pid, {})
        todo = [pid]
        while todo:
            p = todo.pop()
            try:
                for task in Path(f"/proc/{p}/task").iterdir():
                    try:
                        threads[int(task.name)] = int((task / "schedstat").read_text().split()[0])
                        todo += [int(c) for c in (task / "children").read_text().split()]
                    except (FileNotFoundError, ProcessLookupError):
                        continue
            except (FileNotFoundError, ProcessLookupError):
                continue
        return sum(threads.values()) / 1e9

    async def watch(self, pids: list[int], period: float = 0.25) -> None:
        while True:
            for pid in pids:
                self.cpu(pid)
            await asyncio.sleep(period)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))] * 1000


def router_cmd(port: int, prefill: int, decode: int, *extra: str, profile: str | None = None) -> list[str]:
    # --tenancy single: one trusted client (the benchmark), so reuse needs no API key.
    args = [
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
        "--tenancy",
        "single",
        "--reuse-headers",
        *extra,
    ]
    if profile is None:
        return [PY, "-m", "pdx_router.main", *args]
    # cProfile in the router's process, written out when the benchmark stops it.
    code = (
        "import cProfile,os,signal,sys\n"
        "from pdx_router.main import main\n"
        "pr=cProfile.Profile()\n"
        f"def stop(*_):\n pr.disable(); pr.dump_stats({profile!r}); os._exit(0)\n"
        "signal.signal(signal.SIGTERM,stop)\n"
        "pr.enable(); main(sys.argv[1:])\n"
    )
    return [PY, "-c", code, *args]


def bench_tokenizer(root: Path) -> str:
    """A word-level tokenizer for the benchmark's words: fast enough that the fake engines stay
    cheap, and a real tokenizer.json that pdx-router loads as it would a model's."""
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


def peers_bin(venv: Path) -> tuple[Path | None, str]:
    """The peers' venv, created and filled on first use (pip, pinned versions)."""
    bin_dir = venv / "bin"
    if all((bin_dir / exe).exists() for exe in ("vllm-router", "smg")):
        return bin_dir, "cached"
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=120)
        done = subprocess.run(
            [str(bin_dir / "python"), "-m", "pip", "install", "-q", *PEER_PINS],
            capture_output=True,
            timeout=600,
            check=False,
        )
    except (subprocess.SubprocessError, OSError) as exc:
        return None, f"could not make the peers' venv: {exc}"
    if done.returncode != 0:
        return None, "pip install failed: " + done.stderr.decode(errors="replace").strip().splitlines()[-1][:200]
    return bin_dir, "installed"


async def ready_by_request(url: str, timeout: float = 60) -> None:
    """Up when a small streamed chat turn gets through (the P/D hops included)."""
    body = {"model": "Qwen", "messages": [{"role": "user", "content": "word1 word2"}], "stream": True, "max_tokens": 4}
    deadline = time.time() + timeout
    async with aiohttp.ClientSession() as s:
        while time.time() < deadline:
            try:
                async with s.post(url + "/v1/chat/completions", json=body) as r:
                    if r.status == 200 and b"[DONE]" in await r.read():
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.25)
    raise RuntimeError(f"{url} did not route a turn within {timeout:g} s")


async def register_smg_workers(url: str, prefill: str, decode: str) -> None:
    await wait_http(url + "/health", timeout=60)
    async with aiohttp.ClientSession() as s:
        for worker, kind in ((prefill, "prefill"), (decode, "decode")):
            body = {"url": worker, "worker_type": kind, "runtime": "vllm", "labels": {"kv_connector": "NixlConnector"}}
            async with s.post(url + "/workers", json=body) as r:
                if r.status >= 300:
                    raise RuntimeError(f"POST /workers ({kind}): HTTP {r.status}: {(await r.text())[:200]}")


@dataclass
class Target:
    name: str
    turn: Turn
    pid: int | None = None  # whose CPU is the row's (None: direct, the client itself)
    fakes: tuple[int, int, int] = (0, 0, 0)  # the fake engines it talks to: pid, prefill and decode ports
    reuse: bool = False  # send conversation ids (only pdx-router reuses across turns)
    history: bool = False  # send no ids, the answers as they came: pdx-router finds them by history
    idle: float = 0.0  # CPU seconds per second when idle (health checks, polling)
    skipped: str = ""  # why the row has no figures


@dataclass(frozen=True)
class Row:
    """One target's figures in one block (a rep at one concurrency)."""

    rep: int
    conc: int
    name: str
    cpu_ms: float  # router CPU per request, idle cost taken out
    added_p50: float  # TTFT p50 above direct's in the same block, ms


def in_order(targets: list[Target], rep: int) -> list[Target]:
    """Direct first (every block's base), then the routers, reversed on every second rep: a
    machine that drifts within a block then favours no row (it was seen drifting 30-40%)."""
    routers = targets[1:] if rep % 2 == 0 else targets[:0:-1]
    return [targets[0], *routers]


def verdicts(rows: list[Row]) -> list[str]:
    """The issue's three targets, each per concurrency from the median over reps of the
    in-block figure (a ratio of two rows of one block, or their difference)."""

    def per_block(conc: int, f: Callable[[dict[str, Row]], float | None]) -> list[float]:
        out = []
        for rep in sorted({r.rep for r in rows}):
            block = {r.name: r for r in rows if r.rep == rep and r.conc == conc}
            if (v := f(block)) is not None:
                out.append(v)
        return out

    def ratio(a: str, b: str) -> Callable[[dict[str, Row]], float | None]:
        return lambda blk: blk[a].cpu_ms / blk[b].cpu_ms if a in blk and b in blk and blk[b].cpu_ms > 0 else None

    def gap(blk: dict[str, Row]) -> float | None:
        return blk["pdx"].added_p50 - blk["vllm-router"].added_p50 if "pdx" in blk and "vllm-router" in blk else None

    every = sorted({r.conc for r in rows})
    # (what, the block's figure, its limit, unit, the concurrencies it is judged at)
    checks: list[tuple[str, Callable[[dict[str, Row]], float | None], float, str, list[int]]] = [
        ("pdx plain CPU / vllm-router's", ratio("pdx", "vllm-router"), 1.0, "x", every),
        ("pdx-reuse CPU / pdx plain", ratio("pdx-reuse", "pdx"), 1.25, "x", every),
        ("pdx-history CPU / pdx-reuse", ratio("pdx-history", "pdx-reuse"), 1.1, "x", every),
        ("pdx+valve-reuse CPU / pdx-reuse", ratio("pdx+valve-reuse", "pdx-reuse"), 1.02, "x", every),
        ("pdx added TTFT p50 - vllm-router's", gap, 1.0, " ms", [8]),  # the TTFT target
    ]
    lines = ["targets (median over reps of each block's figure; every block's in brackets):"]
    for what, f, limit, unit, concs in checks:
        for conc in concs:
            vals = per_block(conc, f)
            if not vals:
                continue
            mid = statistics.median(vals)
            each = ", ".join(f"{v:.2f}" for v in vals)
            held = "holds" if mid <= limit else "does not hold"
            lines.append(f"  conc {conc:>2} {what}: {mid:.2f}{unit} [{each}], target <= {limit:g}{unit}: {held}")
    return lines


async def fake_lag(s: aiohttp.ClientSession, port: int) -> float:
    async with s.get(f"http://127.0.0.1:{port}/lag") as r:
        return float((await r.json())["p99_ms"])


async def main_async(args: argparse.Namespace) -> None:
    tok_dir = Path(tempfile.mkdtemp(prefix="pdx-bench-tok-"))
    model = bench_tokenizer(tok_dir)
    procs: list[subprocess.Popen[bytes]] = []
    pp, dp = free_port(), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    quiet: dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}

    def spawn(cmd: list[str], env: dict[str, str] = env, **kw: Any) -> int:
        procs.append(subprocess.Popen(cmd, env=env, **{"stdout": subprocess.DEVNULL, **kw}))
        return procs[-1].pid

    pp2, dp2 = free_port(), free_port()
    P, D = f"http://127.0.0.1:{pp}", f"http://127.0.0.1:{dp}"

    def spawn_fakes(prefill: int, decode: int, *extra: str) -> tuple[int, int, int]:
        cmd = [PY, "-m", "pdx_router.testing.fake_engine", "--prefill-port", str(prefill)]
        cmd += ["--decode-port", str(decode), "--prefill-delay", str(args.prefill_ms / 1000)]
        return spawn([*cmd, "--output-tokens", str(OUTPUT_TOKENS), "--tokenizer", model, *extra]), prefill, decode

    try:
        # pdx's engines check reused KV themselves (the engine plugin, emulated); the second
        # pair are engines without it, where the router checks the prefix on the prompt's ids.
        checked = spawn_fakes(pp, dp, "--checks-prefix")
        unchecked = spawn_fakes(pp2, dp2)
        # The same engines with pdx's held-KV valve: every reused turn claims its hold first.
        valved = spawn_fakes(free_port(), free_port(), "--checks-prefix", "--valve") if args.valve_row else None
        targets: list[Target] = [Target("direct", direct(P, D), fakes=checked)]
        starting: list[tuple[Target, Awaitable[None]]] = []

        def pdx(
            name: str,
            cmd_env: dict[str, str],
            *extra: str,
            on: tuple[int, int, int] = checked,
            profile: str | None = None,
        ) -> None:
            port = free_port()
            pid = spawn(router_cmd(port, on[1], on[2], *extra, profile=profile), env=cmd_env)
            url = f"http://127.0.0.1:{port}"
            plain = Target(name, via_proxy(url), pid, on)
            targets.extend([plain, Target(name + "-reuse", via_proxy(url), pid, on, True)])
            starting.append((plain, wait_http(url + "/ready")))

        if args.baseline_src:
            # Another revision's router, from its source tree, beside this one in the same run: by
            # default on the engines without the check (a router before it would not reuse on the
            # others), so compare it with pdx/tok; with --baseline-checked on pdx's own engines and
            # flags, so its rows compare with pdx's.
            src = Path(args.baseline_src).resolve()
            base_env = {**env, "PYTHONPATH": os.pathsep.join(str(src / d) for d in ("router", "contract"))}
            if args.baseline_checked:
                pdx("pdx@base", base_env, "--conversation-from", "id")
            else:
                pdx("pdx@base", base_env, on=unchecked)
        # Plain P/D stays plain: ids only, so a turn without one looks nothing up and keeps nothing.
        pdx("pdx", env, "--conversation-from", "id", profile=args.profile)
        # Reuse without ids (router.conversationFrom both, the default): found by the history.
        pdx("pdx-history", env)
        targets.pop()
        targets[-1] = replace(targets[-1], history=True)
        if args.pure_row:
            # The same router on its pure-Python modules: what compiling the data path takes off.
            from pdx_router.native import PURE_ENV

            pdx("pdx/pure", {**env, PURE_ENV: "1"})
            targets.pop()  # its reuse row: the plain one is the comparison
        if valved is not None:
            pdx("pdx+valve", env, on=valved)  # its reuse row beside pdx-reuse: what claims cost
            targets.pop(-2)
        # The same router where it checks the prefix itself: on /tokenize's ids, and on its own
        # tokenizer's; their plain rows are pdx's (only the reuse path differs).
        pdx("pdx/tok", env, on=unchecked)
        targets.pop(-2)
        if args.tokenizer_row:
            pdx("pdx+tok", env, "--tokenizer", model, on=unchecked)
            targets.pop(-2)

        bin_dir, why = (None, "--no-peers") if args.no_peers else peers_bin(Path(args.peers_venv))
        for name in ("vllm-router", "smg"):
            if bin_dir is None:
                targets.append(Target(name, direct(P, D), fakes=checked, skipped=why))
                continue
            port, mport = free_port(), free_port()
            common = ["--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1"]
            common += ["--prometheus-port", str(mport)]
            if name == "vllm-router":
                cmd = [str(bin_dir / name), "--vllm-pd-disaggregation", "--prefill", P, "--decode", D, *common]
                cmd += ["--prefill-policy", "round_robin", "--decode-policy", "round_robin"]
            else:
                cmd = [str(bin_dir / "smg"), "launch", "--pd-disaggregation", *common, "--policy", "round_robin"]
            t = Target(name, via_proxy(f"http://127.0.0.1:{port}"), spawn(cmd, **quiet), checked)
            targets.append(t)
            url = f"http://127.0.0.1:{port}"

            async def up(url: str = url, smg: bool = name == "smg") -> None:
                if smg:
                    await register_smg_workers(url, P, D)
                await ready_by_request(url)

            starting.append((t, up()))

        path, why = (None, "--no-peers") if args.no_peers else get_upstream_proxy(args.upstream_proxy)
        if path is None:
            targets.append(Target("vllm-example", direct(P, D), fakes=checked, skipped=why))
        else:
            port = free_port()
            cmd = [PY, str(path), "--host", "127.0.0.1", "--port", str(port), "--prefiller-host", "127.0.0.1"]
            cmd += ["--prefiller-port", str(pp), "--decoder-host", "127.0.0.1", "--decoder-port", str(dp)]
            t = Target("vllm-example", via_proxy(f"http://127.0.0.1:{port}"), spawn(cmd, **quiet), checked)
            targets.append(t)
            starting.append((t, wait_http(f"http://127.0.0.1:{port}/health")))

        await wait_http(P + "/health")
        await wait_http(f"http://127.0.0.1:{pp2}/health")
        for t, ready in starting:
            try:
                await ready
            except (RuntimeError, aiohttp.ClientError) as exc:
                t.skipped = f"did not start: {exc}"
        # Each router's idle cost (health checks, worker polling), all idle at once.
        live = {t.pid for t in targets if t.pid and not t.skipped}
        clock = ThreadClock()
        watcher = asyncio.ensure_future(clock.watch([*live, checked[0], unchecked[0]]))
        cpu0 = {pid: clock.cpu(pid) for pid in live}
        await asyncio.sleep(args.idle_seconds)
        idle = {pid: (clock.cpu(pid) - cpu0[pid]) / args.idle_seconds for pid in live}
        for t in targets:
            t.idle = idle.get(t.pid or 0, 0.0)
        print(
            "fake engines (two pairs, a process each; one checks the prefix as the pdx plugin does): "
            f"prefill {args.prefill_ms:g} ms, decode 5 ms to first token, "
            f"2 ms/token, {OUTPUT_TOKENS} tokens; histories of 2-6k tokens growing to ~8k; "
            f"{args.turns} streamed turns per conversation, at least {args.conversations} conversations a row"
            + (f", mean think time {THINK_MS:g} ms" if THINK_MS else ", no think time (lockstep)")
        )
        import pdx_router

        print(f"pdx-router's data path (this tree): {pdx_router.NATIVE}")
        for t in targets:
            if t.skipped:
                print(f"  {t.name}: skipped, {t.skipped}")
            elif t.pid:
                print(f"  {t.name}: idle cost {t.idle * 1000:.2f} ms CPU per second (subtracted)")
        if args.tokenizer_row and not any(t.skipped for t in targets if t.name == "pdx+tok-reuse"):
            tok = next(t for t in targets if t.name == "pdx+tok-reuse")
            await run(tok.turn, 8, 1, "probation", True)  # 8 matches: the tokenizer is trusted
        head = (
            f"{'conc':>4} {'target':<15} {'TTFT p50':>8} {'p99':>7} {'added p50':>9} {'p99':>7} {'req/s':>6} "
            f"{'CPU ms/req':>10} {'sys':>4} {'µs/chunk':>8} {'x pdx':>6} {'fakes cores':>11} {'lag p99':>7}"
        )
        rows: list[Row] = []
        for rep in range(args.reps):
            print(f"\nrep {rep + 1}\n{head}\n" + "-" * len(head))
            for conc in args.concurrency:
                base: float | None = None
                base99 = 0.0
                lines: list[tuple[str, float | None, str]] = []  # (before the ratio, CPU ms, after it)
                for t in in_order(targets, rep):
                    if t.skipped or (args.only and t.name not in args.only and t.name != "direct"):
                        continue
                    engines_pid, lag_port, _ = t.fakes
                    async with aiohttp.ClientSession() as s:
                        await fake_lag(s, lag_port)  # reset
                        c0, e0, w0 = clock.cpu(t.pid) if t.pid else 0.0, clock.cpu(engines_pid), time.perf_counter()
                        s0 = tree_cpu(t.pid, system_only=True) if t.pid else 0.0
                        t0 = tree_cpu(t.pid) if t.pid else 0.0
                        ttfts, chunks, rps = await run(
                            t.turn, conc, args.turns, f"{t.name}{rep}-{conc}", t.reuse, args.conversations, t.history
                        )
                        wall = time.perf_counter() - w0
                        lag = await fake_lag(s, lag_port)
                    fakes = (clock.cpu(engines_pid) - e0) / wall
                    p50, p99 = pct(ttfts, 0.5), pct(ttfts, 0.99)
                    if base is None:
                        base, base99 = p50, p99
                    added = f"{'':>9} {'':>7}" if t.pid is None else f"{p50 - base:>+9.2f} {p99 - base99:>+7.2f}"
                    cpu = per_chunk = sys_share = ""
                    ms: float | None = None
                    if t.pid:
                        n = len(ttfts) + 2 * conc  # the warm-up turns ran in the same window
                        used = clock.cpu(t.pid) - c0
                        # The kernel's share from the ticks (schedstat does not split it).
                        ticks = tree_cpu(t.pid) - t0
                        sys_share = f"{(tree_cpu(t.pid, system_only=True) - s0) / ticks:.0%}" if ticks else ""
                        ms = (used - t.idle * wall) * 1000 / n
                        rows.append(Row(rep, conc, t.name, ms, p50 - base))
                        cpu = f"{ms:.3f}"
                        per_chunk = f"{ms * 1000 / (sum(chunks) / len(chunks)):.0f}"
                    lines.append((
                        f"{conc:>4} {t.name:<15} {p50:>8.2f} {p99:>7.2f} {added} {rps:>6.1f} "
                        f"{cpu:>10} {sys_share:>4} {per_chunk:>8}",
                        ms,
                        f"{fakes:>11.2f} {lag:>7.1f}",
                    ))  # fmt: skip
                # Printed once the block is whole: in reversed order pdx, the ratios' base, runs last.
                pdx_cpu = next((r.cpu_ms for r in rows if (r.rep, r.conc, r.name) == (rep, conc, "pdx")), None)
                for left, ms, right in lines:
                    ratio = f"{ms / pdx_cpu:.2f}" if ms is not None and pdx_cpu else ""
                    print(f"{left} {ratio:>6} {right}")
        print("\n" + "\n".join(verdicts(rows)))
        watcher.cancel()
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
    global THINK_MS, OUTPUT_TOKENS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument(
        "--conversations", type=int, default=8, help="conversations per row at least (at most --concurrency at once)"
    )
    ap.add_argument("--prefill-ms", type=float, default=20.0)
    ap.add_argument("--upstream-proxy", help="path to disagg_proxy_multiturn.py (skips download)")
    ap.add_argument("--reps", type=int, default=1, help="repeat every row this often (printed one after the other)")
    ap.add_argument("--idle-seconds", type=float, default=5.0, help="how long each router's idle cost is measured")
    ap.add_argument("--peers-venv", default=str(PEERS), help="venv for vllm-router and smg (made on first use)")
    ap.add_argument("--no-peers", action="store_true", help="pdx-router's rows only (no install, no download)")
    ap.add_argument("--tokenizer-row", action="store_true", help="also pdx-router with its own tokenizer (reuse)")
    ap.add_argument("--pure-row", action="store_true", help="also pdx-router on its pure-Python data path (plain)")
    ap.add_argument("--valve-row", action="store_true", help="also pdx-router reusing on engines with the KV valve")
    ap.add_argument("--profile", help="cProfile pdx-router (this revision's) into this file")
    ap.add_argument("--only", nargs="+", help="targets to run besides direct (default: all)")
    ap.add_argument("--think-ms", type=float, default=0.0, help="mean pause between turns (default: none)")
    ap.add_argument(
        "--output-tokens", type=int, default=OUTPUT_TOKENS, help="streamed tokens a turn (split per-chunk cost)"
    )
    ap.add_argument(
        "--baseline-src",
        help="source tree of another revision (git worktree add DIR REV): its router runs as pdx-router@base",
    )
    ap.add_argument(
        "--baseline-checked",
        action="store_true",
        help="run pdx@base on pdx's engines with pdx's flags (a base whose router takes the engines' prefix check)",
    )
    args = ap.parse_args()
    THINK_MS, OUTPUT_TOKENS = args.think_ms, args.output_tokens
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
