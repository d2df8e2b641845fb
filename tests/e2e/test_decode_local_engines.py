"""Decode-local turns on real engines: vLLM (CPU build) prefill + decode over NIXL, the pdx
router with `router.decodeLocalMaxTokens` set, the topology rendered by the operator's code.

A short follow-up turn goes whole to the decode that holds the conversation, which computes it
from its own prefix cache. Its greedy output must equal a recompute of the whole prompt token
for token (seeded weights: wrong KV would change it), decode's prefix cache must have served the
history, and the next turn must reuse again: locally, or through prefill's read when it is long.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from pdx.local import default_document
from pdx.local.topology import LocalTopology
from tests.e2e.chat import Answer, chat, metric

pytest.importorskip("vllm", reason="needs the engine extra (scripts/setup.sh)")
pytestmark = [pytest.mark.engines, pytest.mark.timeout(1200)]

MAX_LOCAL = 256  # tokens: the turns below add ~40 (local) or ~700 (through prefill)
HISTORY = " ".join(f"The {i}th note says the reactor {i % 7} runs at {i * 13 % 97} percent." for i in range(60))
LONG_SUFFIX = " ".join(f"Row {i}: valve {i % 11} reads {i * 7 % 53} bar, pump {i % 5} idles." for i in range(60))


def document() -> dict[str, Any]:
    doc = copy.deepcopy(default_document())
    spec = doc["spec"]
    spec["model"]["name"] = "/models/pdx-tiny-w"  # seeded weights: wrong KV changes logits
    spec["model"].pop("loadFormat", None)
    spec["kvTransfer"]["bidirectional"] = True
    spec.setdefault("router", {})["decodeLocalMaxTokens"] = MAX_LOCAL
    return doc


@pytest.fixture(scope="module")
def topo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTopology]:
    with LocalTopology(document(), state_dir=tmp_path_factory.mktemp("local")) as t:
        yield t


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def test_short_turns_run_on_decode_equal_a_recompute_and_the_next_turn_reuses(topo: LocalTopology) -> None:
    router = topo.router_url
    prefill = topo.engine_urls["prefill"][0]
    decode = topo.engine_urls["decode"][0]
    suffixes = ["Which reactor runs hottest?", "And the coolest one?", "Summarise: " + LONG_SUFFIX]
    msgs = [{"role": "system", "content": "You read plant notes."}, user(HISTORY)]
    answers: list[Answer] = [chat(router, msgs, conversation=None)]
    cache_hits: list[float] = []
    for suffix in suffixes:
        msgs = [*msgs, assistant(answers[-1].text), user(suffix)]
        before = metric(decode, "vllm:prefix_cache_hits_total")
        answers.append(chat(router, msgs, conversation=None))
        cache_hits.append(metric(decode, "vllm:prefix_cache_hits_total") - before)
        # the reference: the whole prompt on prefill, from its own computation (no KV read from anyone)
        reference = chat(prefill, msgs, conversation=None)
        got = answers[-1]
        assert got.tokens == reference.tokens, f"turn {len(answers)}: {got.text!r} != {reference.text!r}"
    assert [a.reuse for a in answers] == ["miss", "local", "local", "hit"]
    # decode's own cache served the history of each local turn: at least the first turn's prompt
    assert all(hits >= answers[0].prompt_tokens - 64 for hits in cache_hits[:2]), cache_hits
    assert answers[3].reused_tokens >= answers[2].prompt_tokens  # prefill read the local turn's KV back


def test_an_engine_tokenizes_a_later_turn_from_its_cache_to_the_ids_of_a_whole_tokenization(
    topo: LocalTopology,
) -> None:
    """pdx_engine.tokenize_cache on vLLM's own chat path: the ids prefill reports for each turn
    equal the model tokenizer's whole tokenization, and its log shows the cache served a turn."""
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(topo.model_dir))  # the model the engines run
    prefill = topo.engine_urls["prefill"][0]
    msgs = [{"role": "system", "content": "You read plant notes."}, user(HISTORY + " " + LONG_SUFFIX)]
    for turn in range(3):
        answer = chat(prefill, msgs, conversation=None, token_ids=True, max_tokens=4)
        whole = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        assert answer.prompt_ids == tok(whole, add_special_tokens=False)["input_ids"], f"turn {turn}"
        msgs += [assistant(answer.text), user(f"Turn {turn}: which valve reads highest? " + HISTORY[:900])]
    assert "ids came from the tokenize cache" in topo.log_path(topo.by_role("prefill")[0].name).read_text()
