"""The engines reuse decode's KV only for the prompt's own tokens, checked by digest."""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

from pdx_contract import kv_prefix
from pdx_engine import prefix_check

HELD = list(range(1000, 1100))  # 100 tokens decode holds, blocks of 16: 6 full and 4 over
BS = 16


def held(ids: list[int] = HELD, n: int = len(HELD)) -> dict[str, Any]:
    return {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_block_ids": [list(range(7))],
        "remote_num_tokens": 0,
        kv_prefix.HELD: kv_prefix.held_prefix(ids, n, BS).to_json(),
    }


def check(prompt: list[int], threshold: int = 8, params: dict[str, Any] | None = None) -> tuple[dict[str, Any], Any]:
    p = held() if params is None else params
    return p, kv_prefix.check_params(p, prompt, threshold)


def test_a_prompt_that_continues_what_decode_holds_reads_all_of_it() -> None:
    params, found = check([*HELD, 5, 6, 7])
    assert found == kv_prefix.Verdict(outcome="hit", tokens=100)
    assert params["remote_num_tokens"] == 100 and params["remote_block_ids"] == [list(range(7))]
    assert kv_prefix.HELD not in params


def test_an_edited_token_keeps_only_the_blocks_before_it() -> None:
    prompt = [*HELD, 5]
    prompt[40] = 7  # block 2 (tokens 32-47) differs
    params, found = check(prompt)
    assert found == kv_prefix.Verdict(outcome="hit", tokens=32)
    assert params["remote_num_tokens"] == 32 and params["remote_block_ids"] == [[0, 1]]


def test_the_last_prompt_token_is_always_computed() -> None:
    params, found = check(HELD)  # the same 100 tokens: one is left for logits
    assert found == kv_prefix.Verdict(outcome="hit", tokens=99)
    assert params["remote_block_ids"] == [list(range(7))]


def test_a_shorter_prompt_reads_its_whole_blocks_only() -> None:
    params, found = check(HELD[:50])  # 3 full blocks, 2 tokens into the 4th
    assert found == kv_prefix.Verdict(outcome="hit", tokens=48)
    assert params["remote_block_ids"] == [[0, 1, 2]]


def test_little_in_common_reads_nothing_and_says_why() -> None:
    params, found = check([1, *HELD])
    assert found == kv_prefix.Verdict(outcome="prefix_mismatch", tokens=0) and params["remote_num_tokens"] == 0
    _, found = check(HELD[:20], threshold=64)
    assert found == kv_prefix.Verdict(outcome="below_threshold", tokens=0)


def test_a_malformed_held_prefix_reads_nothing() -> None:
    params = held()
    params[kv_prefix.HELD] = {**params[kv_prefix.HELD], "digests": "AAAA"}  # too few digests
    params, found = check([*HELD, 1], params=params)
    assert found == kv_prefix.Verdict(outcome="prefix_mismatch", tokens=0) and params["remote_num_tokens"] == 0
    params = {**held(), kv_prefix.HELD: {"numTokens": "100"}}
    assert check([*HELD, 1], params=params)[1] == kv_prefix.Verdict(outcome="prefix_mismatch", tokens=0)


def test_params_without_a_held_prefix_are_left_as_they_came() -> None:
    params = {"do_remote_decode": True, "remote_num_tokens": 80, "remote_block_ids": [[1, 2]]}
    assert kv_prefix.check_params(params, HELD, 8) is None
    assert params == {"do_remote_decode": True, "remote_num_tokens": 80, "remote_block_ids": [[1, 2]]}


def test_a_second_look_at_the_same_request_gives_the_same_verdict() -> None:
    prompt = [*HELD, 5]
    prompt[40] = 7
    params, first = check(prompt)
    assert kv_prefix.check_params(params, prompt, 8) == first and params["remote_num_tokens"] == 32


def test_decode_names_what_it_holds_and_hides_the_count_from_unchecked_readers() -> None:
    out = {"do_remote_decode": True, "remote_num_tokens": 100, "remote_block_ids": [[1]]}
    kv_prefix.hold_params(out, [*HELD, 9], BS)
    assert out["remote_num_tokens"] == 0
    assert kv_prefix.HeldPrefix.model_validate(out[kv_prefix.HELD]) == kv_prefix.held_prefix(HELD, 100, BS)
    off = {"do_remote_decode": True, "remote_num_tokens": 0}  # bidirectional off: nothing kept
    kv_prefix.hold_params(off, HELD, BS)
    assert off == {"do_remote_decode": True, "remote_num_tokens": 0}


# ---------------------------------------------------------------- the patch on vLLM's connector


@dataclass
class Request:
    prompt_token_ids: list[int]
    all_token_ids: list[int]
    kv_transfer_params: dict[str, Any] | None


@dataclass
class Scheduler:
    kv_recompute_threshold: int = 8
    block_size: int = BS


@dataclass
class Connector:
    """Stands in for vLLM's NixlBaseConnector: what the scheduler answers, recorded."""

    connector_scheduler: Scheduler = field(default_factory=Scheduler)
    seen: list[Any] = field(default_factory=list)

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        params = request.kv_transfer_params or {}
        self.seen.append(params.get("remote_num_tokens"))
        return int(params.get("remote_num_tokens") or 0) - num_computed_tokens, True

    def request_finished(self, request: Request, block_ids: Any) -> tuple[bool, dict[str, Any]]:
        decode = not (request.kv_transfer_params or {}).get("do_remote_decode")
        return True, {"do_remote_decode": decode, "do_remote_prefill": not decode, "remote_num_tokens": 100}

    def request_finished_all_groups(self, request: Request, block_ids: Any) -> tuple[bool, dict[str, Any]]:
        return self.request_finished(request, block_ids)


def test_the_patched_connector_checks_on_prefill_and_names_the_held_tokens_on_decode() -> None:
    cls = type("Connector", (Connector,), {})
    module = types.ModuleType(prefix_check.MODULE)
    module.NixlBaseConnector = cls  # type: ignore[attr-defined]
    assert prefix_check.patch_module(module) and not prefix_check.patch_module(module)
    conn = cls()
    prompt = [*HELD, 5]
    prompt[40] = 7
    req = Request(prompt, prompt, held())
    assert conn.get_num_new_matched_tokens(req, 0) == (32, True)
    _, answer = conn.request_finished(req, ([1],))
    assert answer[kv_prefix.VERDICT] == {"outcome": "hit", "tokens": 32}
    # Decode (its request came from prefill): the finished turn's params name what it holds.
    dreq = Request(HELD[:90], [*HELD, 1], {"do_remote_prefill": True})
    _, out = conn.request_finished_all_groups(dreq, ([1],))
    assert out["remote_num_tokens"] == 0 and out[kv_prefix.HELD]["numTokens"] == 100
    assert kv_prefix.VERDICT not in out


def test_a_hold_made_under_one_cache_salt_matches_no_prompt_under_another() -> None:
    salted = held()
    salted[kv_prefix.HELD] = kv_prefix.held_prefix(HELD, len(HELD), BS, salt="tenant-a").to_json()
    other = dict(salted)
    assert kv_prefix.check_params(other, [*HELD, 5], 8, salt="tenant-b") == kv_prefix.Verdict(
        outcome="prefix_mismatch", tokens=0
    )
    assert other["remote_num_tokens"] == 0
    assert kv_prefix.check_params(dict(salted), [*HELD, 5], 8) == kv_prefix.Verdict(outcome="prefix_mismatch", tokens=0)
    assert kv_prefix.check_params(dict(salted), [*HELD, 5], 8, salt="tenant-a") == kv_prefix.Verdict(
        outcome="hit", tokens=100
    )


def test_without_a_salt_the_chain_is_the_one_of_before_salts() -> None:
    assert kv_prefix.digest_chain(HELD, 100, BS) == kv_prefix.digest_chain(HELD, 100, BS, salt="")
    assert kv_prefix.digest_chain(HELD, 100, BS) != kv_prefix.digest_chain(HELD, 100, BS, salt="a")
