#!/usr/bin/env python3
"""A reused chat turn's prompt ids on real engines: the engine's /tokenize, or the router's own.

`router.tokenizer: engine` waits, every reused turn, for prefill's `/tokenize` of the whole
prompt; `router` renders the chat and encodes only the turn's new tail in the router, from the
head the previous turn left. This starts the embedded local CR (real vLLM CPU engines, its own
tokenizer files) and times both on the same agent-shaped chats (a first prompt of `--tokens`,
then tool results; turns past the first), at `--concurrency`, with the engines idle and then
while `--load` streamed completions run through the router:

- engine: /tokenize's latency (the router's wait) on the real prefill;
- router: the CPU of render + resume (digest of the head, encode of the tail), in this process
  (what the router's event loop spends), and of a whole-prompt encode for comparison (what the
  engine's API server spends per /tokenize, outside its template).

    .venv/bin/python scripts/bench_prompt_ids.py [--tokens 4000] [--turns 6] [--concurrency 8] [--load 4]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from pdx.local import default_document
from pdx.local.topology import LocalTopology
from pdx_router import ids
from pdx_router.chat_tokens import ChatTokenizer, TextPrefix

WORDS = ("the", "a", "file", "line", "error", "value", "result", "test", "build", "module", "function", "return")


def chats(tokens: int, turns: int, n: int, seed: int) -> list[list[list[dict[str, str]]]]:
    """n conversations, each a list of turns' message lists (growing)."""
    out = []
    for c in range(n):
        rng = random.Random(seed + c)

        def text(k: int, rng: random.Random = rng) -> str:
            return " ".join(f"{rng.choice(WORDS)}{rng.randrange(100)}" for _ in range(k))

        msgs = [{"role": "system", "content": text(tokens // 3)}, {"role": "user", "content": text(40)}]
        convo = [list(msgs)]
        for _ in range(turns - 1):
            msgs += [{"role": "assistant", "content": text(20)}, {"role": "user", "content": text(120)}]
            convo.append(list(msgs))
        out.append(convo)
    return out


def ms(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))] * 1000


async def tokenize_latencies(url: str, model: str, prompts: list[list[dict[str, str]]], conc: int) -> list[float]:
    sem, out = asyncio.Semaphore(conc), []
    async with aiohttp.ClientSession() as http:

        async def one(msgs: list[dict[str, str]]) -> None:
            async with sem:
                t0 = time.perf_counter()
                body = {"model": model, "messages": msgs, "add_generation_prompt": True}
                async with http.post(url + "/tokenize", json=body) as r:
                    await r.read()
                    assert r.status == 200, r.status
                out.append(time.perf_counter() - t0)

        await asyncio.gather(*(one(m) for m in prompts))
    return out


async def load(url: str, model: str, convos: list[list[list[dict[str, str]]]], stop: asyncio.Event) -> int:
    """Streamed completions through the router until stopped (each a conversation's turns)."""
    done = 0
    async with aiohttp.ClientSession() as http:

        async def one(i: int, convo: list[list[dict[str, str]]]) -> None:
            nonlocal done
            while not stop.is_set():
                for msgs in convo:
                    body = {
                        "model": model,
                        "messages": msgs,
                        "stream": True,
                        "max_tokens": 32,
                        "conversation_id": f"l{i}",
                    }
                    async with http.post(url + "/v1/chat/completions", json=body) as r:
                        await r.read()
                    done += 1
                    if stop.is_set():
                        return

        await asyncio.gather(*(one(i, c) for i, c in enumerate(convos)))
    return done


def router_side(tok: ChatTokenizer, convos: list[list[list[dict[str, str]]]]) -> tuple[list[float], list[float]]:
    """CPU seconds per reused turn: render + resume; and a whole-prompt encode."""
    resumes, wholes = [], []
    for convo in convos:
        prefix: TextPrefix | None = None
        held = ids.EMPTY
        for msgs in convo:
            t0 = time.process_time()
            text = tok.render({"messages": msgs})
            assert text is not None
            got = tok.resume(text, prefix, held, ids.count(held)) if prefix is not None else None
            t1 = time.process_time()
            whole = ids.of_list(tok.encode(text))
            t2 = time.process_time()
            if prefix is not None:
                assert got == whole, "the router's ids differ from a whole encode"
                resumes.append(t1 - t0)
                wholes.append(t2 - t1)
            prefix, held = tok.prefix_of(text, whole), whole
    return resumes, wholes


async def main(args: argparse.Namespace) -> None:
    doc: dict[str, Any] = default_document()
    convos = chats(args.tokens, args.turns, args.concurrency, args.seed)
    later = [msgs for convo in convos for msgs in convo[1:]]
    with LocalTopology(doc, state_dir=Path(tempfile.mkdtemp(prefix="pdx-prompt-ids-"))) as topo:
        model = doc["spec"]["model"].get("servedModelName") or doc["spec"]["model"]["name"]
        tok = ChatTokenizer.from_dir(topo.model_dir)
        prefill = topo.engine_urls["prefill"][0]
        await tokenize_latencies(prefill, model, later[:4], 2)  # warm
        idle = await tokenize_latencies(prefill, model, later, args.concurrency)
        stop = asyncio.Event()
        busy_load = asyncio.create_task(load(topo.router_url, model, chats(args.tokens, 3, args.load, 99), stop))
        await asyncio.sleep(5)
        busy = await tokenize_latencies(prefill, model, later, args.concurrency)
        stop.set()
        served = await busy_load
        resumes, wholes = router_side(tok, convos)
    n = ids.count(ids.of_list(tok.encode(tok.render({"messages": convos[0][-1]}) or "")))
    print(f"{len(later)} reused turns of {args.concurrency} chats, up to {n} tokens; concurrency {args.concurrency}")
    print(f"engine /tokenize, engines idle:      p50 {ms(idle, 0.5):7.1f} ms  p99 {ms(idle, 0.99):7.1f} ms")
    print(f"engine /tokenize, {args.load} streams running: p50 {ms(busy, 0.5):7.1f} ms  p99 {ms(busy, 0.99):7.1f} ms"
          f"  ({served} streamed turns meanwhile)")  # fmt: skip
    for what, xs in (("router render + resume (CPU):", resumes), ("a whole-prompt encode (CPU):", wholes)):
        print(f"{what:36s} p50 {ms(xs, 0.5):7.2f} ms  mean {statistics.mean(xs) * 1000:.2f} ms")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=4000, help="about the first prompt's size")
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--load", type=int, default=4, help="streamed conversations through the router meanwhile")
    p.add_argument("--seed", type=int, default=0)
    asyncio.run(main(p.parse_args()))
