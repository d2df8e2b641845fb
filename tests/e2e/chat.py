"""A minimal streaming chat client for the end-to-end tests: text, logprobs, TTFT, pdx headers."""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

MODEL = "pdx-tiny"


@dataclass
class Answer:
    text: str
    logprobs: list[float]
    tokens: list[str]
    ttft_ms: float
    headers: dict[str, str] = field(default_factory=dict)
    prompt_tokens: int = 0
    token_ids: list[int] | None = None  # the output's ids, when asked for (return_token_ids)
    prompt_ids: list[int] | None = None  # the prompt's ids as the engine rendered it, when asked for
    first_id: str = ""  # the first chunk's id: the router's own when it streamed prefill's token

    @property
    def reuse(self) -> str:
        return self.headers.get("x-pdx-reuse", "")

    @property
    def reused_tokens(self) -> int:
        return int(self.headers.get("x-pdx-reused-tokens", "0"))


def chat(
    url: str,
    messages: list[dict[str, str]],
    conversation: str | None,
    max_tokens: int = 12,
    token_ids: bool = False,
    api_key: str | None = None,
    logprobs: bool = True,
) -> Answer:
    """One streamed, greedy turn through the router (as an agent sends it).

    `token_ids`: ask for the prompt's and the output's ids (vLLM's return_token_ids), which the
    router passes on to a client that asked; token texts alone can hide two ids of equal text.
    `logprobs=False` asks as most agents do (and lets the router stream prefill's first token)."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": logprobs,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if token_ids:
        body["return_token_ids"] = True
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    if conversation:
        body["conversation_id"] = conversation
        headers["X-Session-ID"] = conversation
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(), headers=headers)
    start = time.perf_counter()
    ttft = 0.0
    text, lps, tokens, prompt_tokens = [], [], [], 0
    ids: list[int] = []
    prompt_ids: list[int] | None = None
    done = False
    first_id = ""
    with urllib.request.urlopen(req, timeout=900) as resp:
        got = {k.lower(): v for k, v in resp.headers.items()}
        for raw in resp:
            line = raw.decode().strip()
            done = done or line == "data: [DONE]"
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            first_id = first_id or chunk.get("id", "")
            # A turn that fails after the status line ends with an error event and no [DONE]:
            # a failed turn, not an empty answer.
            assert "error" not in chunk, f"the turn failed: {chunk['error']}"
            assert "kv_transfer_params" not in chunk, "router leaked engine internals"
            if chunk.get("usage"):
                prompt_tokens = chunk["usage"]["prompt_tokens"]
            if token_ids and chunk.get("prompt_token_ids") is not None:
                prompt_ids = chunk["prompt_token_ids"]
            for choice in chunk.get("choices", []):
                if token_ids:
                    ids += choice.get("token_ids") or []
                    prompt_ids = choice.get("prompt_token_ids") or prompt_ids
                else:
                    assert "token_ids" not in choice or choice["token_ids"] is None, "router leaked token ids"
                piece = choice.get("delta", {}).get("content")
                if piece:
                    ttft = ttft or (time.perf_counter() - start) * 1000
                    text.append(piece)
                for lp in (choice.get("logprobs") or {}).get("content") or []:
                    lps.append(lp["logprob"])
                    tokens.append(lp["token"])
    assert done, "the stream ended without [DONE]"
    return Answer(
        "".join(text), lps, tokens, ttft, got, prompt_tokens, ids if token_ids else None, prompt_ids, first_id
    )


def metric(url: str, name: str) -> float:
    """Sum of a Prometheus counter/histogram-count series on an engine's /metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            rest = line[len(name) :]
            if rest[:1] in ("{", " "):
                total += float(line.rsplit(" ", 1)[1])
    return total


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as resp:
        out: dict[str, Any] = json.loads(resp.read())
    return out


def raw_turn(
    prefill: str, decode: str, messages: list[dict[str, str]], held: dict[str, Any] | None, max_tokens: int = 12
) -> tuple[Answer, dict[str, Any]]:
    """The 3-hop protocol by hand, attaching `held` (decode's last params) as given: no checks.

    This is what a router without a prefix check does; tests use it to show that such
    reuse is wrong when the history changed.
    """
    kv = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    if held:
        kv = {**held, "do_remote_decode": True, "do_remote_prefill": False}
    base = {"model": MODEL, "messages": messages, "temperature": 0}
    first = _post(
        f"{prefill}/v1/chat/completions", {**base, "max_tokens": 1, "stream": False, "kv_transfer_params": kv}
    )
    out = _post(
        f"{decode}/v1/chat/completions",
        {**base, "max_tokens": max_tokens, "logprobs": True, "kv_transfer_params": first["kv_transfer_params"]},
    )
    content = out["choices"][0]["logprobs"]["content"]
    answer = Answer(
        text=out["choices"][0]["message"]["content"],
        logprobs=[c["logprob"] for c in content],
        tokens=[c["token"] for c in content],
        ttft_ms=0.0,
        prompt_tokens=out["usage"]["prompt_tokens"],
    )
    return answer, out["kv_transfer_params"]
