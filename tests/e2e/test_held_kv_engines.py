"""Held KV under memory pressure on real engines: vLLM (CPU build) prefill + decode over NIXL,
pdx's valve in decode (pdx_engine.held_kv), the router claiming holds, the topology rendered
by the operator's code.

Decode gets a KV cache of a few conversations. When a new conversation does not fit, decode
takes what it lacks from the youngest unclaimed hold at once (its conversation comes back
last), from the hold's tail, instead of waiting out the TTL (600 s here); that conversation's
next turn reads at most the kept prefix (or is `released` and recomputed), never a freed block,
and its greedy output equals a recompute. A hold the router claimed is never touched under it,
until its claim's lease is over: by then prefill declines to start the read.
"""

from __future__ import annotations

import concurrent.futures
import copy
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from pdx.local import default_document
from pdx.local.topology import LocalTopology
from pdx_contract import holds as contract
from pdx_contract import load
from pdx_engine import held_kv
from tests.e2e.chat import Answer, chat

pytest.importorskip("vllm", reason="needs the engine extra (scripts/setup.sh)")
pytestmark = [pytest.mark.engines, pytest.mark.timeout(1200)]

BLOCKS = 24  # decode's KV blocks of 128 tokens (one is vLLM's null block): ~2.9k tokens
TTL = 600  # far above any turn here: a turn that waited for it would fail the test's timing
LEASE = 10  # seconds a leased claim pins: the shortest the plugin allows (held_kv.MIN_LEASE_S)
MARGIN = 5  # vLLM's prefill declines a read this close to its deadline (_KV_BLOCKS_EXPIRY_SAFETY_MARGIN)


def document() -> dict[str, Any]:
    doc = copy.deepcopy(default_document())
    spec = doc["spec"]
    spec["model"]["name"] = "/models/pdx-tiny-w"  # seeded weights: wrong KV changes logits
    spec["model"].pop("loadFormat", None)
    spec["model"]["maxModelLen"] = 2048
    spec["decode"]["extraArgs"] = ["--num-gpu-blocks-override", str(BLOCKS)]
    spec["decode"].setdefault("env", {})[held_kv.SHORTEN_ENV] = "1"  # holds give up their tails only
    spec["decode"]["env"][held_kv.LEASE_ENV] = str(LEASE)
    spec["kvTransfer"]["decoderKvBlocksTtlSeconds"] = TTL
    return doc


@pytest.fixture(scope="module")
def topo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTopology]:
    with LocalTopology(document(), state_dir=tmp_path_factory.mktemp("local")) as t:
        yield t


def history(topic: str) -> list[dict[str, str]]:
    """A first turn of about 1k tokens (8-9 blocks held after it)."""
    notes = " ".join(f"{topic} note {i}: unit {i % 7} reads {i * 13 % 97}." for i in range(70))
    return [{"role": "system", "content": "You read notes."}, {"role": "user", "content": notes}]


def post(url: str, body: dict[str, Any], timeout: float = 600) -> Any:
    """A JSON POST straight to an engine; its JSON answer."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def holds(decode: str, body: contract.HoldsRequest) -> contract.HoldsAnswer:
    return contract.HoldsAnswer.model_validate(post(decode + contract.PATH, body.to_json(), timeout=60))


def follow_up(msgs: list[dict[str, str]], answer: Answer, text: str) -> list[dict[str, str]]:
    return [*msgs, {"role": "assistant", "content": answer.text}, {"role": "user", "content": text}]


def test_held_conversations_yield_to_new_ones_and_a_released_one_recomputes_correctly(topo: LocalTopology) -> None:
    router, prefill, decode = topo.router_url, topo.engine_urls["prefill"][0], topo.engine_urls["decode"][0]
    before = holds(decode, contract.HoldsRequest())
    assert before.valve and before.capacity_blocks == BLOCKS
    convs = {name: history(name) for name in ("alpha", "beta", "gamma")}
    first: dict[str, Answer] = {}
    started = time.monotonic()
    for name, msgs in convs.items():
        first[name] = chat(router, msgs, conversation=None)
    filled_s = time.monotonic() - started
    after = holds(decode, contract.HoldsRequest())
    # three conversations hold more than decode keeps: the youngest hold gave way, nobody waited the TTL
    assert after.releases + after.trims > before.releases + before.trims, after
    assert after.held_blocks <= BLOCKS
    assert filled_s < TTL / 4, f"the first turns took {filled_s:.0f} s: a request waited for held KV"
    # beta's hold, the youngest when gamma needed room, gave up what gamma lacked (its tail, or
    # all of it): its next turn reads at most the kept prefix, or recomputes, and equals a recompute
    msgs = follow_up(convs["beta"], first["beta"], "Which unit reads highest?")
    got = chat(router, msgs, conversation=None)
    reference = chat(prefill, msgs, conversation=None)
    assert after.trims > before.trims, "no hold gave up only its tail"
    assert got.reuse == "hit", got.headers
    assert 0 < got.reused_tokens < first["beta"].prompt_tokens, "beta read tokens decode had freed"
    assert got.tokens == reference.tokens, f"{got.text!r} != {reference.text!r}"
    # alpha, the oldest, is still held whole: its next turn reads it back, and equals a recompute
    msgs = follow_up(convs["alpha"], first["alpha"], "Which unit reads lowest?")
    got = chat(router, msgs, conversation=None)
    reference = chat(prefill, msgs, conversation=None)
    assert got.reuse in ("hit", "released"), got.headers
    assert got.tokens == reference.tokens, f"{got.text!r} != {reference.text!r}"


def hold_prompt(topic: str) -> str:
    return " ".join(f"{topic} entry {i}: gauge {i % 5} shows {i * 11 % 89}." for i in range(70))


def hold_on_decode(decode: str, topic: str) -> str:
    """A turn prefilled and decoded on decode itself (a decode-local turn, as the router sends
    it): decode keeps its KV for a later read and names the hold in its answer."""
    rid = held_params(decode, topic)["remote_request_id"]
    assert isinstance(rid, str)
    return rid


def held_params(decode: str, topic: str) -> dict[str, Any]:
    """`hold_on_decode`'s turn: the kv_transfer_params decode returns, what a prefill reads by."""
    prompt = hold_prompt(topic)
    body = {
        "model": "pdx-tiny",
        "prompt": prompt,
        "max_tokens": 4,
        "temperature": 0,
        "kv_transfer_params": {"do_remote_decode": False, "do_remote_prefill": False},
    }
    kv: dict[str, Any] = post(decode + "/v1/completions", body)["kv_transfer_params"]
    assert kv["remote_blocks_expiry_time"] is not None, kv  # bidirectional: decode holds it
    return kv


def test_a_claimed_hold_outlives_pressure_and_yields_once_the_claim_is_dropped(topo: LocalTopology) -> None:
    router, decode = topo.router_url, topo.engine_urls["decode"][0]
    pinned = hold_on_decode(decode, "epsilon")
    assert holds(decode, contract.HoldsRequest(claim=[pinned])).held == [pinned]
    before = holds(decode, contract.HoldsRequest())
    for name in ("zeta", "eta", "theta"):  # each ~9 blocks: more than what is left beside the pin
        chat(router, history(name), conversation=None)
    pressed = holds(decode, contract.HoldsRequest(claim=[pinned], release_claim=[pinned]))
    assert pressed.releases + pressed.trims > before.releases + before.trims, "the turns above did not press"
    assert pressed.held == [pinned] and pinned not in pressed.kept, "a claimed hold was released or shortened"
    holds(decode, contract.HoldsRequest(release_claim=[pinned]))  # unclaimed: free to go now
    for name in ("iota", "kappa", "lambda"):
        chat(router, history(name), conversation=None)
    after = holds(decode, contract.HoldsRequest(claim=[pinned]))
    assert after.held == [] or pinned in after.kept, "an unclaimed hold did not yield"
    log = topo.log_path(topo.by_role("decode")[0].name).read_text()
    assert "held KV yields to new work under pressure (valve on)" in log
    # the next turn decode holds names the latest releases in its answer (the router's hint)
    holds(decode, contract.HoldsRequest(release_claim=after.held))
    gone = holds(decode, contract.HoldsRequest(release_unclaimed=True))
    note = contract.ReleasedNote.model_validate(held_params(decode, "nu")[contract.RELEASED_KV])
    assert note.released and note.seq == gone.seq and note.released == gone.released[-len(note.released) :], note


def test_a_claim_whose_drop_never_comes_pins_its_hold_for_its_lease_and_no_read_starts_after_it(
    topo: LocalTopology,
) -> None:
    prefill, decode = topo.engine_urls["prefill"][0], topo.engine_urls["decode"][0]
    kv = held_params(decode, "mu")
    hold = kv["remote_request_id"]
    granted = holds(decode, contract.HoldsRequest(claim=[hold], lease=True))  # a router that then dies
    assert granted.held == [hold] and granted.claim_expiry is not None and granted.claimed >= 1
    # the read the router would have sent, capped at the lease, arrives too late: prefill declines it
    time.sleep(max(0.0, granted.claim_expiry - MARGIN - time.perf_counter()) + 0.5)
    late = {**kv, "remote_blocks_expiry_time": granted.claim_expiry}
    body = {"model": "pdx-tiny", "prompt": hold_prompt("mu") + " Next?", "max_tokens": 1, "kv_transfer_params": late}
    try:
        post(prefill + "/v1/completions", body)
    except urllib.error.HTTPError as exc:  # kvTransfer.loadFailurePolicy fail: the router retries plain
        assert exc.code == 500, exc
    log = topo.log_path(topo.by_role("prefill")[0].name).read_text()
    assert "Declining expired remote read" in log
    # past the lease the orphaned claim pins nothing (the valve may release the hold in its turn,
    # tests/engine/test_held_kv.py), while the hold itself stays until pressure picks it
    time.sleep(max(0.0, granted.claim_expiry - time.perf_counter()) + 0.5)
    lapsed = holds(decode, contract.HoldsRequest())
    assert lapsed.claimed == 0, lapsed
    assert holds(decode, contract.HoldsRequest(claim=[hold], release_claim=[hold], lease=True)).held == [hold]


def test_a_decode_local_turns_hold_is_freed_by_prefills_read(topo: LocalTopology) -> None:
    """vLLM's decode worker frees a held turn when prefill's read notice arrives, but it tracks
    only requests that came with transfer parameters it acts on; a decode-local turn's request
    (both flags false) was never tracked, so its read notice was dropped ("unrecognized request")
    and the hold stayed until the valve took it: with the valve off, for good."""
    prefill, decode = topo.engine_urls["prefill"][0], topo.engine_urls["decode"][0]
    kv = held_params(decode, "rho")
    hold = kv["remote_request_id"]
    body = {"model": "pdx-tiny", "prompt": hold_prompt("rho") + " And then?", "max_tokens": 1, "kv_transfer_params": kv}
    verdict = post(prefill + "/v1/completions", body)["kv_transfer_params"]
    assert verdict is not None
    log = topo.log_path(topo.by_role("decode")[0].name)
    deadline = time.monotonic() + 30
    while holds(decode, contract.HoldsRequest(claim=[hold])).held == [hold]:
        holds(decode, contract.HoldsRequest(release_claim=[hold]))
        assert time.monotonic() < deadline, "prefill read the hold, decode still holds it"
        time.sleep(0.5)
    assert f"unrecognized request {hold}" not in log.read_text()


def test_decode_answers_its_requests_in_flight_on_the_load_route(topo: LocalTopology) -> None:
    """What the router's decode-local rule reads instead of rendering vLLM's /metrics."""
    decode = topo.engine_urls["decode"][0]

    def in_flight() -> int:
        with urllib.request.urlopen(decode + load.PATH, timeout=10) as resp:
            return load.LoadAnswer.model_validate_json(resp.read()).requests

    assert in_flight() == 0
    body = {"model": "pdx-tiny", "prompt": hold_prompt("mu"), "max_tokens": 400, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(post, decode + "/v1/completions", body)
        seen = 0
        while not answer.done() and not seen:
            seen = in_flight()
        assert answer.result()["choices"][0]["text"] is not None
    assert seen == 1 and in_flight() == 0
