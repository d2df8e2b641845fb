"""The correctness checks of scripts/gpu-correct.sh with decode-local on (the GPU default), on real
vLLM CPU engines: follow-ups prefilled on decode reuse what decode holds through its own prefix
cache (counted from its `vllm:prefix_cache_hits_total`), with greedy output equal to OFF's."""

from __future__ import annotations

import json
import urllib.request

import pytest

from pdx.local.topology import LocalTopology
from pdx_contract import holds as contract
from tests.e2e.correctness import bidirectional, entry_points, judge, run_leg
from tests.e2e.test_real_engines import document

pytest.importorskip("vllm", reason="needs the engine extra (scripts/setup.sh)")
pytestmark = [pytest.mark.engines, pytest.mark.timeout(1200)]


def test_decode_local_follow_ups_pass_every_correctness_check(tmp_path_factory: pytest.TempPathFactory) -> None:
    doc = document(True)
    doc["spec"]["router"]["decodeLocalMaxTokens"] = 1024
    legs = {}
    for name, on in (("off", False), ("on", True)):
        with LocalTopology(bidirectional(doc, on), state_dir=tmp_path_factory.mktemp(name)) as topo:
            legs[name] = run_leg(topo)
            if on:
                after = holds_of(topo.engine_urls["decode"][0])
    verdict = judge(legs["off"], legs["on"], loaded=entry_points())
    assert verdict.passed, verdict.failures
    local = [r for r in verdict.turns if r["reuse"] == "local"]
    assert local, "no follow-up was prefilled on decode"
    assert all(r["reusedTokens"] >= (r["expectedReuse"] or 1) for r in local)
    # each local turn's hold covers the one it continued, which decode then let go (superseded,
    # not pressure): a conversation keeps one hold, not one per turn
    assert after.seq - after.releases >= 1 and after.releases == 0, after


def holds_of(decode: str) -> contract.HoldsAnswer:
    body = json.dumps(contract.HoldsRequest().to_json()).encode()
    req = urllib.request.Request(decode + contract.PATH, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return contract.HoldsAnswer.model_validate(json.loads(resp.read()))
