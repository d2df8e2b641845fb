"""The engine fixture's pair really does P->D and D->P transfers."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from tests.engines.conftest import EnginePair

FIRST_HOP = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
             "remote_block_ids": None, "remote_host": None, "remote_port": None}


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        result: dict[str, Any] = json.load(r)
        return result


@pytest.mark.engines
def test_second_turn_reads_decode_kv(engine_pair: EnginePair) -> None:
    p, d = engine_pair.prefill.url, engine_pair.decode.url
    prompt = list(range(100, 700))
    base = {"model": "pdx", "temperature": 0, "return_token_ids": True}
    pre = _post(p + "/v1/completions", {**base, "prompt": prompt, "max_tokens": 1,
                                        "kv_transfer_params": FIRST_HOP})
    dec = _post(d + "/v1/completions", {**base, "prompt": prompt, "max_tokens": 8, "ignore_eos": True,
                                        "kv_transfer_params": pre["kv_transfer_params"]})
    kv = dec["kv_transfer_params"]
    generated = dec["choices"][0]["token_ids"]
    assert kv["remote_engine_id"] == "decode-0"
    assert kv["remote_num_tokens"] == len(prompt) + len(generated) - 1
    turn2 = prompt + generated + list(range(2000, 2100))
    pre2 = _post(p + "/v1/completions", {**base, "prompt": turn2, "max_tokens": 1, "kv_transfer_params": kv})
    assert pre2["kv_transfer_params"]["remote_prefill_cached_tokens"] == kv["remote_num_tokens"]
