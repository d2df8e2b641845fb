"""Reuse without a conversation id on real engines (issue 32): vLLM (CPU build) prefill + decode
over NIXL and the pdx router, the topology rendered by the operator's code, tenants by API key.

Real clients that send no `conversation_id` or `X-Session-ID` reuse decode's KV from their
second turn on, the router finding each conversation by its history (chat) or by its prompt's
prefix (completions): vLLM's own multi-turn benchmark without `--send-conversation-id`, a chat
loop written with the `openai` package, and a completions loop. One topology serves them all;
each case counts the router's stats around its own turns.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pdx.local import default_document
from pdx.local.topology import LocalTopology
from pdx_bench.compat import SCRIPT, cache_dir, obtain_sdist
from tests.e2e.correctness import router_stats

pytest.importorskip("vllm", reason="needs the engine extra (scripts/setup.sh)")
openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.engines, pytest.mark.timeout(900)]

MODEL = "pdx-tiny"
KEY = "sk-tenant-a"
# vLLM's benchmarks/multi_turn (0.33.0): not in the wheel, so scripts/setup.sh fetches vLLM's
# source release with pip into the cache (pdx_bench.compat); nothing of it enters the repository.

HISTORY = " ".join(f"Log line {i}: service {i % 9} answered in {i * 37 % 211} ms, queue {i % 4}." for i in range(50))


def document() -> dict[str, Any]:
    doc = copy.deepcopy(default_document())
    router = doc["spec"].setdefault("router", {})
    router["tenancy"] = {"identity": "apiKey"}  # as a shared deployment runs: the key is the tenant
    router["reuseHeaders"] = True
    router.pop("conversationFrom", None)  # the default, both: an id when sent, else the history
    return doc


@pytest.fixture(scope="module")
def topo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTopology]:
    with LocalTopology(document(), state_dir=tmp_path_factory.mktemp("local")) as t:
        yield t


def counts(url: str) -> dict[str, int]:
    """The router's reuse outcomes and how turns found their entries, flattened."""
    stats = router_stats(url)
    out = {f"reuse.{k}": int(v) for k, v in stats["reuse"].items() if isinstance(v, int)}
    out.update({f"foundBy.{k}": int(v) for k, v in stats["foundBy"].items()})
    return out


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


def pandas_path() -> str | None:
    """Where vLLM's script finds pandas (its one import pdx lacks): the venv, or the directory
    `python -m pdx_bench.compat` installs it into. Nothing is installed here."""
    for extra in ("", str(cache_dir() / "vllm-bench-deps")):
        env = {**os.environ, "PYTHONPATH": extra}
        probe = subprocess.run([sys.executable, "-c", "import pandas"], env=env, capture_output=True, check=False)
        if probe.returncode == 0:
            return extra
    return None


def test_vllms_multi_turn_benchmark_without_conversation_ids_hits_every_follow_up_turn(
    topo: LocalTopology, tmp_path: Path
) -> None:
    vllm_bench = obtain_sdist() / SCRIPT  # cached by setup.sh
    deps = pandas_path()
    if deps is None:
        pytest.fail("vLLM's multi-turn benchmark imports pandas: scripts/setup.sh installs it beside the cache")
    conversations, turns = 2, 3
    data = [
        {
            "id": f"bench-{c}",
            "messages": [
                m
                for t in range(turns)
                for m in (
                    {"role": "user", "content": (f"Conversation {c}. {HISTORY}" if t == 0 else f"Now check item {t}.")},
                    {"role": "assistant", "content": "placeholder"},
                )
            ],
        }
        for c in range(conversations)
    ]
    (tmp_path / "input.json").write_text(json.dumps(data))
    cmd = [
        sys.executable, str(vllm_bench),
        "--input-file", str(tmp_path / "input.json"),
        "--model", str(topo.model_dir),
        "--served-model-name", MODEL,
        "--url", topo.router_url,
        "--api-key", KEY,
        "--num-clients", "1",
        "--max-active-conversations", "1",  # with more, it stops at its first finished conversation
        "--limit-max-tokens", "8",
        "--limit-min-tokens", "8",
        "--stats-json-output", str(tmp_path / "stats.json"),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": deps, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    before = counts(topo.router_url)
    proc = subprocess.run(cmd, cwd=vllm_bench.parent, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "conversation_id" not in (tmp_path / "input.json").read_text()
    records = json.loads((tmp_path / "stats.json").read_text())
    assert len(records) == conversations * turns
    follow_ups = conversations * (turns - 1)
    got = delta(before, counts(topo.router_url))
    assert got.get("reuse.hit") == follow_ups, got
    assert got.get("foundBy.history") == follow_ups and "foundBy.id" not in got and "foundBy.header" not in got, got


def test_an_openai_package_chat_loop_without_an_id_hits_from_turn_2(topo: LocalTopology) -> None:
    client = openai.OpenAI(base_url=topo.router_url + "/v1", api_key=KEY, max_retries=0)
    msgs: list[Any] = [{"role": "system", "content": "You read logs."}, {"role": "user", "content": HISTORY}]
    seen: list[tuple[str, str]] = []
    before = counts(topo.router_url)
    for i in range(3):
        if i == 1:  # not streamed
            raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=msgs, max_tokens=8)
            text = raw.parse().choices[0].message.content or ""
        else:
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=msgs, max_tokens=8, stream=True
            )
            text = "".join((c.choices[0].delta.content or "") if c.choices else "" for c in raw.parse())
        seen.append((raw.headers["x-pdx-reuse"], raw.headers["x-pdx-found-by"]))
        msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": f"And service {i}?"}]
    client.close()
    assert seen == [("miss", "history"), ("hit", "history"), ("hit", "history")]
    got = counted_within(topo, before, 5.0)
    assert (got.get("reuse.hit"), got.get("foundBy.history")) == (2, 2), got


def counted_within(topo: LocalTopology, before: dict[str, int], seconds: float) -> dict[str, int]:
    """The router's counts since `before`, once they show two history hits or `seconds` passed: a
    streamed turn is counted once its relay has ended, just after the client read [DONE]."""
    deadline = time.monotonic() + seconds
    while True:
        got = delta(before, counts(topo.router_url))
        if (got.get("reuse.hit"), got.get("foundBy.history")) == (2, 2) or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def test_another_tenant_sending_the_same_history_finds_nothing_and_takes_nothing(topo: LocalTopology) -> None:
    owner = openai.OpenAI(base_url=topo.router_url + "/v1", api_key=KEY, max_retries=0)
    other = openai.OpenAI(base_url=topo.router_url + "/v1", api_key="sk-tenant-b", max_retries=0)
    msgs: list[Any] = [{"role": "user", "content": "Tenant A's notes. " + HISTORY}]
    first = owner.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8)
    msgs += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "Next?"}]
    probe = other.chat.completions.with_raw_response.create(model=MODEL, messages=msgs, max_tokens=8)
    assert (probe.status_code, probe.headers["x-pdx-reuse"]) == (200, "miss")
    after = owner.chat.completions.with_raw_response.create(model=MODEL, messages=msgs, max_tokens=8)
    assert (after.headers["x-pdx-reuse"], after.headers["x-pdx-found-by"]) == ("hit", "history")
    owner.close()
    other.close()


def test_a_completions_loop_with_a_text_prompt_and_no_id_hits_from_turn_2(topo: LocalTopology) -> None:
    client = openai.OpenAI(base_url=topo.router_url + "/v1", api_key=KEY, max_retries=0)
    prompt = "Logs follow.\n" + HISTORY + "\nSummary:"
    seen: list[tuple[str, str]] = []
    before = counts(topo.router_url)
    for i in range(3):
        if i == 1:  # not streamed
            raw = client.completions.with_raw_response.create(model=MODEL, prompt=prompt, max_tokens=8)
            text = raw.parse().choices[0].text
        else:
            raw = client.completions.with_raw_response.create(model=MODEL, prompt=prompt, max_tokens=8, stream=True)
            text = "".join(c.choices[0].text if c.choices else "" for c in raw.parse())
        seen.append((raw.headers["x-pdx-reuse"], raw.headers["x-pdx-found-by"]))
        prompt += text + f"\nQuestion {i}: which service was slowest?\nAnswer:"
    client.close()
    assert seen == [("miss", "history"), ("hit", "history"), ("hit", "history")]
    got = counted_within(topo, before, 5.0)
    assert (got.get("reuse.hit"), got.get("foundBy.history")) == (2, 2), got
