#!/usr/bin/env python3
"""What a server costs for the client-facing half of a routed turn, and nothing else:
aiohttp's (pdx-router's before) and pdx-router's own (`pdx_router.front`), side by side.

A server (its own process, uvloop) reads a chat body of about `--words` words, parses it, and
streams 50 events: the first through the server's stream, the rest written to the socket from
timer callbacks 2 ms apart, as pdx-router's relay writes decode's blocks. No engine is called.
The load generator sends `--requests` turns at `--concurrency`, to each server in turn,
`--reps` times. Printed: each server's user and system CPU per request (/proc). The timers
cost the same in both: the difference is the servers'.

    .venv/bin/python scripts/bench_client_side.py [--requests 400] [--concurrency 8] [--reps 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import orjson

from pdx.local.topology import free_port

EVENT = (
    b'data: {"id":"chatcmpl-abc123","object":"chat.completion.chunk","created":1733000000,"model":"Qwen",'
    b'"choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":null}]}\n\n'
)
EVENTS = 50


def _ticks(transport: asyncio.Transport, chunked: bool) -> asyncio.Future[None]:
    """The 49 events after the first, from timer callbacks (as the relay writes them)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    left = [EVENTS - 1]
    framed = b"%x\r\n%s\r\n" % (len(EVENT), EVENT) if chunked else EVENT

    def tick() -> None:
        transport.write(framed)
        left[0] -= 1
        if left[0]:
            loop.call_later(0.002, tick)
        else:
            done.set_result(None)

    loop.call_later(0.002, tick)
    return done


def serve_front(port: int) -> None:
    import uvloop

    from pdx_router.front import Request, Routes, Server, Stream
    from pdx_router.metrics import Metrics

    async def chat(req: Request) -> Stream:
        orjson.loads(await req.read())
        out = Stream(200, {"Content-Type": "text/event-stream"})
        out.start(req)
        out.write(EVENT)
        assert out.transport is not None
        await _ticks(out.transport, out.chunked)
        out.end()
        return out

    async def main() -> None:
        routes = Routes()
        routes.add("POST", "/v1/chat/completions", chat)
        await Server(routes, Metrics(), 4096, 10.0, 1 << 24).start("127.0.0.1", port)
        await asyncio.Event().wait()

    uvloop.install()
    asyncio.run(main())


def serve(port: int) -> None:
    import uvloop
    from aiohttp import web

    async def chat(req: web.Request) -> web.StreamResponse:
        orjson.loads(await req.read())
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(req)
        await out.write(EVENT)
        assert req.transport is not None
        await _ticks(req.transport, True)  # type: ignore[arg-type]
        await out.write_eof()
        return out

    uvloop.install()
    app = web.Application(client_max_size=1 << 24)
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, handler_cancellation=True, print=None)


def cpu(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


async def load(url: str, words: int, requests: int, concurrency: int) -> None:
    content = " ".join(f"w{i}" for i in range(words))
    body = orjson.dumps({"model": "Qwen", "messages": [{"role": "user", "content": content}], "stream": True})
    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(headers={"Content-Type": "application/json"}) as http:

        async def one() -> None:
            async with sem, http.post(url, data=body) as r:
                await r.read()

        await asyncio.gather(*(one() for _ in range(requests)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--words", type=int, default=6000, help="the chat body's size (6000: about 40 KB)")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    p.add_argument("--server", choices=("aiohttp", "front"), default="aiohttp", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        (serve_front if args.server == "front" else serve)(args.serve)
        return
    n = args.requests
    print(f"the client side alone, {n} streamed turns of {EVENTS} events at concurrency {args.concurrency}:")
    for rep in range(args.reps):
        for which in ("aiohttp", "front"):
            port = free_port()
            server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--server", which])
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            try:
                time.sleep(2)
                asyncio.run(load(url, args.words, 20, 2))  # warm up
                u0, s0 = cpu(server.pid)
                asyncio.run(load(url, args.words, args.requests, args.concurrency))
                u1, s1 = cpu(server.pid)
            finally:
                server.terminate()
                server.wait()
            user, system = (u1 - u0) * 1000 / n, (s1 - s0) * 1000 / n
            print(f"  rep {rep + 1} {which:8} user {user:.2f} ms + system {system:.2f} ms of CPU per request")


if __name__ == "__main__":
    main()
