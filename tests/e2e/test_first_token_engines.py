"""Prefill's first token streamed to the client (`router.firstTokenFromPrefill`) on real engines:
vLLM (CPU build) prefill + decode over NIXL, decode with the `pdx_engine.first_token` logits
processor the operator renders, the pdx router.

Every streamed turn's first chunk is prefill's token, written by the router before decode's hop;
decode starts with that token and the router cuts it from decode's stream. The text the client
reads must equal a recompute of the whole prompt token for token (seeded weights, greedy), on
first turns and on follow-ups that read decode's KV back.
"""

from __future__ import annotations

import copy
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from pdx.local import default_document
from pdx.local.topology import LocalTopology
from pdx_contract.first_token import ARG
from tests.e2e.chat import MODEL, chat

pytest.importorskip("vllm", reason="needs the engine extra (scripts/setup.sh)")
pytestmark = [pytest.mark.engines, pytest.mark.timeout(1200)]

HISTORY = " ".join(f"Step {i}: the agent read file {i % 9} and found {i * 11 % 89} lines." for i in range(50))
TOOL_OUTPUT = " ".join(f"line {i}: value {i * 7 % 61} at offset {i * 13 % 97}" for i in range(40))


def document() -> dict[str, Any]:
    doc = copy.deepcopy(default_document())
    spec = doc["spec"]
    spec["model"]["name"] = "/models/pdx-tiny-w"  # seeded weights: a wrong first token changes what follows
    spec["model"].pop("loadFormat", None)
    spec["kvTransfer"]["bidirectional"] = True
    spec.setdefault("router", {})["firstTokenFromPrefill"] = True
    return doc


@pytest.fixture(scope="module")
def topo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTopology]:
    with LocalTopology(document(), state_dir=tmp_path_factory.mktemp("first-token")) as t:
        yield t


def streamed(url: str, messages: list[dict[str, str]]) -> tuple[str, list[dict[str, Any]], dict[str, str]]:
    """A streamed greedy turn as an agent sends it (no log-probabilities, no ids): its text, its
    chunks and its headers."""
    body = {"model": MODEL, "messages": messages, "max_tokens": 12, "temperature": 0, "stream": True}
    req = urllib.request.Request(
        f"{url}/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    chunks: list[dict[str, Any]] = []
    done = False
    with urllib.request.urlopen(req, timeout=900) as resp:
        headers = {k.lower(): v for k, v in resp.headers.items()}
        for raw in resp:
            line = raw.decode().strip()
            done = done or line == "data: [DONE]"
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                chunks.append(chunk)
    assert done, "the stream ended without [DONE]"
    text = "".join((c["choices"][0].get("delta") or {}).get("content") or "" for c in chunks if c.get("choices"))
    return text, chunks, headers


def test_streamed_turns_start_with_prefills_token_and_equal_a_recompute(topo: LocalTopology) -> None:
    router, prefill = topo.router_url, topo.engine_urls["prefill"][0]
    msgs = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": HISTORY}]
    outcomes = []
    for suffix in ("What did step 3 find?", "Here is the tool's output: " + TOOL_OUTPUT, "Which file next?"):
        text, chunks, headers = streamed(router, msgs)
        outcomes.append(headers["x-pdx-reuse"])
        reference = chat(prefill, msgs, conversation=None)  # the whole prompt recomputed, greedy
        assert text == reference.text, f"turn {len(outcomes)}: {text!r} != {reference.text!r}"
        # the router's opening, not decode's chunk: its id is the router's request id
        assert chunks[0]["id"] == "chatcmpl-" + headers["x-request-id"]
        opening = chunks[1]["choices"][0]["delta"]["content"]
        assert opening and reference.text.startswith(opening)  # prefill's token, as decode went on from it
        roles = [c for c in chunks if c.get("choices") and "role" in c["choices"][0].get("delta", {})]
        assert len(roles) == 1  # decode's own role chunk was cut
        msgs = [*msgs, {"role": "assistant", "content": text}, {"role": "user", "content": suffix}]
    assert outcomes == ["miss", "hit", "hit"]  # follow-ups read decode's KV back, and start with prefill's token


def test_decode_starts_with_the_token_it_is_told_and_goes_on_from_it(topo: LocalTopology) -> None:
    decode = topo.engine_urls["decode"][0]

    def complete(**extra: Any) -> list[int]:
        body = {"model": MODEL, "prompt": HISTORY, "max_tokens": 6, "temperature": 0, "return_token_ids": True}
        req = urllib.request.Request(
            f"{decode}/v1/completions",
            data=json.dumps({**body, **extra}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=300) as resp:
            ids: list[int] = json.loads(resp.read())["choices"][0]["token_ids"]
        return ids

    greedy = complete()
    other = (greedy[0] + 1) % 1000
    forced = complete(vllm_xargs={ARG: other})
    assert forced[0] == other and forced != greedy  # told another token: it starts there, greedy after
    assert complete(vllm_xargs={ARG: greedy[0]}) == greedy  # told its own: nothing changes
