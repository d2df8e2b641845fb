"""The figures behind the router's bounds (issue 16), for whichever router is on PYTHONPATH.

    PYTHONPATH=<tree>/router:<tree>/contract:<tree>/operator python scripts/bounds_figures.py

- metrics: /metrics size and scrape time after 20,000 requests to junk paths, and the longest
  the event loop stalled during that scrape (a 1 ms ticker);
- slowloris: 300 connections that send a request's headers one line a second; how many are
  still open 2 s after the header timeout (10 s, the default);
- stream: StreamFilter's time to relay one 8 MiB and one 32 MiB event fed in 64 KiB reads.

Each part runs alone with --only metrics|slowloris|stream.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import socket
import subprocess
import sys
import time

import aiohttp
import orjson

from pdx_router.app import build
from pdx_router.config import RouterConfig
from pdx_router.filters import StreamFilter


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def metrics(junk: int = 20_000) -> None:
    serving = build(RouterConfig())
    port = await serving.start("127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        small = len(await (await http.get(url + "/metrics")).read())

        async def hit(n: int) -> None:
            for _ in range(n):
                async with http.get(f"{url}/{secrets.token_hex(8)}") as r:
                    await r.read()

        await asyncio.gather(*(hit(junk // 50) for _ in range(50)))
        stall = 0.0
        done = False

        async def tick() -> None:
            nonlocal stall
            last = time.perf_counter()
            while not done:
                await asyncio.sleep(0.001)
                now = time.perf_counter()
                stall = max(stall, now - last)
                last = now

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        async with http.get(url + "/metrics") as r:
            big = len(await r.read())
        took = time.perf_counter() - t0
        done = True
        await ticker
    await serving.close()
    print(
        f"metrics: /metrics {small / 1024:.1f} KiB before, {big / 1024:.1f} KiB after {junk} junk paths; "
        f"scrape {took * 1000:.0f} ms, event loop stalled at most {stall * 1000:.0f} ms"
    )


async def slowloris(n: int = 300, header_timeout: float = 10.0) -> None:
    port = _free_port()
    # The router as it runs in its pod: `pdx-router` (uvloop), its defaults; no engine is asked.
    router = [sys.executable, "-m", "pdx_router.main", "--host", "127.0.0.1", "--port", str(port)]
    router += ["--prefill", "http://127.0.0.1:9", "--decode", "http://127.0.0.1:9"]  # never reached
    proc = subprocess.Popen(router, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        await asyncio.sleep(0.1)
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
            break
    conns = []
    for _ in range(n):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        conns.append((reader, writer))
    t0 = time.monotonic()
    while time.monotonic() - t0 < header_timeout + 2:
        await asyncio.sleep(1)
        for _, writer in conns:
            if not writer.is_closing():
                with contextlib.suppress(OSError):
                    writer.write(b"X-Slow: 1\r\n")
    still = 0
    for reader, writer in conns:
        try:
            while await asyncio.wait_for(reader.read(4096), 0.05):
                pass  # the 408, then the end
        except TimeoutError:
            still += 1
        except OSError:
            pass
        writer.close()
    proc.terminate()
    proc.wait(timeout=10)
    print(
        f"slowloris: of {n} connections sending headers a line a second, "
        f"{still} still open after {header_timeout + 2:g} s"
    )


def stream(sizes: tuple[int, ...] = (8 << 20, 32 << 20), read: int = 64 << 10) -> None:
    for size in sizes:
        head = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"'
        tail = b'"},"token_ids":[11]}]}\n\n'
        event = head + b"a" * (size - len(head) - len(tail)) + tail
        f = StreamFilter(capture=True, strip_ids=True)
        t0 = time.perf_counter()
        out = [f.feed(event[i : i + read]) for i in range(0, len(event), read)]
        out.append(f.flush())
        took = time.perf_counter() - t0
        relayed = b"".join(out)
        assert f.captured.output_ids == [11] and b"token_ids" not in relayed, "the event was not relayed whole"
        assert orjson.loads(relayed[6:])["choices"][0]["delta"]["content"].startswith("aaa")
        print(f"stream: one {size >> 20} MiB event in {read >> 10} KiB reads relayed in {took * 1000:.0f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=("metrics", "slowloris", "stream"))
    args = p.parse_args()
    if args.only in (None, "stream"):
        stream()
    if args.only in (None, "metrics"):
        asyncio.run(metrics())
    if args.only in (None, "slowloris"):
        asyncio.run(slowloris())


if __name__ == "__main__":
    main()
