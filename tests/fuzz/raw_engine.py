"""An engine that answers every completion with the bytes it is given, then closes: health
and metrics as a vLLM's, so the router keeps it in its pool between fuzzed answers."""

from __future__ import annotations

import asyncio

_METRICS = b'vllm:cache_config_info{block_size="16"} 1.0\n'


class RawEngine:
    def __init__(self) -> None:
        self.answer = b""
        self.server: asyncio.Server | None = None
        self.url = ""
        self.completions = 0

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self.url

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                if head.startswith((b"GET /health", b"GET /metrics")):
                    body = _METRICS if head.startswith(b"GET /metrics") else b"{}"
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                    await writer.drain()
                    continue
                self.completions += 1
                writer.write(self.answer)
                await writer.drain()
                break  # the answer's end is the connection's, whatever its head said
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        writer.close()
