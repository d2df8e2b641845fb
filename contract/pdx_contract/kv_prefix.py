"""The held prefix: how decode names the tokens whose KV it keeps, so prefill can check them.

vLLM trusts `remote_num_tokens`: a prefill reading decode's blocks for a prompt that differs
from what decode ran computes on wrong KV. The pdx engine plugin closes that inside the
engines, where the token ids are known. Decode adds to its final `kv_transfer_params` a chain
of digests of the tokens it holds, one per KV block (the last block may be partial), and sets
`remote_num_tokens` to 0 so that an engine without the plugin reads nothing. Prefill's plugin
hashes the new prompt the same way, keeps the longest run of equal digests, sets
`remote_num_tokens` to it (cutting `remote_block_ids`) and reports its verdict in its answer.
The router then needs neither the prompt's ids nor decode's: it stores decode's parameters as
they came and passes them on, and reads the verdict from prefill's answer.

The chain starts from the request's `cache_salt` (vLLM's own per-tenant cache key, which the
router sets per tenant), so a hold made under one salt never matches a prompt under another:
the engines, not only the router, keep tenants' KV apart.

Typed here once: the engine plugin writes and checks these, the router and the test engines
read them. The digests are stdlib only (the engine's scheduler computes them per request).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import sys
from array import array
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, ValidationError

from .base import Document

HELD = "pdx_held_prefix"  # decode's final kv_transfer_params: what it holds (HeldPrefix)
VERDICT = "pdx_reuse"  # prefill's answer's kv_transfer_params: what it found (Verdict)
CHECKED = "pdx_checked"  # prefill's request params, once checked: the verdict (vLLM may ask twice)
DIGEST_BYTES = 8  # per block: a 2**-64 chance of taking another prompt's block for this one


class HeldPrefix(Document):
    """The `num_tokens` tokens decode holds, as a chain of digests at every block boundary."""

    num_tokens: int = Field(gt=0, lt=1 << 31)
    block_size: int = Field(gt=0, lt=1 << 16)
    digests: str
    """Base64 of DIGEST_BYTES per block: the first block's digest, then each next block's over
    the one before and its tokens, the last over the tokens up to num_tokens."""

    def chain(self) -> bytes | None:
        """The digests as bytes; None when they do not cover num_tokens (refused, not guessed)."""
        try:
            raw = base64.b64decode(self.digests, validate=True)
        except (binascii.Error, ValueError):
            return None
        blocks = -(-self.num_tokens // self.block_size)
        return raw if len(raw) == blocks * DIGEST_BYTES else None


    def cut(self, tokens: int) -> HeldPrefix | None:
        """The same prefix ending at the last block boundary within ``tokens`` (decode shortened
        its hold to them); None when no whole block is left or the digests are malformed."""
        chain = self.chain()
        blocks = min(tokens, self.num_tokens) // self.block_size
        if chain is None or blocks <= 0:
            return None
        if blocks * self.block_size >= self.num_tokens:
            return self
        digests = base64.b64encode(chain[: blocks * DIGEST_BYTES]).decode()
        return HeldPrefix(num_tokens=blocks * self.block_size, block_size=self.block_size, digests=digests)


_NUM_TOKENS = HeldPrefix.model_fields["num_tokens"].alias or "num_tokens"  # its wire name

Outcome = Literal["hit", "prefix_mismatch", "below_threshold"]


class Verdict(Document):
    """What prefill's check found: how many of decode's tokens it reads (0 unless a hit)."""

    outcome: Outcome
    tokens: int = Field(ge=0, lt=1 << 31)


def held_tokens(params: dict[str, Any]) -> int | None:
    """How many tokens decode's params say it holds, if they name them (HELD), without
    checking the digests: that is prefill's to do."""
    held = params.get(HELD)
    n = held.get(_NUM_TOKENS) if isinstance(held, dict) else None
    return n if type(n) is int else None


def _packed(token_ids: Sequence[int], n: int) -> bytes:
    ids = array("I", token_ids[:n])
    if sys.byteorder != "little":
        ids.byteswap()
    return ids.tobytes()


def salt_seed(salt: str | None) -> bytes:
    """Where a chain of digests starts: nothing without a salt (as before salts), else the
    salt's digest. The engines' tokenize cache starts its chains here too."""
    return hashlib.blake2b(b"cache_salt\x00" + salt.encode(), digest_size=DIGEST_BYTES).digest() if salt else b""


def digest_chain(token_ids: Sequence[int], n: int, block_size: int, salt: str | None = None) -> bytes:
    """The chained digests of the first n ids (n <= len), a DIGEST_BYTES piece per block,
    starting from the request's cache_salt."""
    raw, out, last = _packed(token_ids, n), [], salt_seed(salt)
    step = 4 * block_size
    for start in range(0, 4 * n, step):
        last = hashlib.blake2b(last + raw[start : start + step], digest_size=DIGEST_BYTES).digest()
        out.append(last)
    return b"".join(out)


def held_prefix(token_ids: Sequence[int], n: int, block_size: int, salt: str | None = None) -> HeldPrefix:
    """What decode reports of the n tokens whose KV it keeps (under the request's cache_salt)."""
    chain = digest_chain(token_ids, n, block_size, salt)
    return HeldPrefix(num_tokens=n, block_size=block_size, digests=base64.b64encode(chain).decode())


def _comparable(held: HeldPrefix, prompt_len: int) -> int:
    """How far a prompt can be compared: to num_tokens, or its own last whole block (a
    partial block of the prompt's is not a boundary decode hashed)."""
    if prompt_len >= held.num_tokens:
        return held.num_tokens
    return prompt_len - prompt_len % held.block_size


def verified_tokens(held: HeldPrefix, chain: bytes, prompt_ids: Sequence[int], salt: str | None = None) -> int:
    """How many leading prompt tokens are the held ones: the last block boundary (or
    num_tokens) up to which every digest matches the prompt's (under the same salt)."""
    n, bs = _comparable(held, len(prompt_ids)), held.block_size
    mine = digest_chain(prompt_ids, n, bs, salt)
    k = len(mine) // DIGEST_BYTES  # blocks that match; the chain makes every digest after a
    if mine != chain[: len(mine)]:  # difference differ too, so the first one ends the run
        k = next(
            i
            for i in range(k)
            if mine[i * DIGEST_BYTES : (i + 1) * DIGEST_BYTES] != chain[i * DIGEST_BYTES : (i + 1) * DIGEST_BYTES]
        )
    return min(k * bs, held.num_tokens)


def verdict(
    held: HeldPrefix, chain: bytes, prompt_ids: Sequence[int], threshold: int, salt: str | None = None
) -> Verdict:
    """Prefill's decision for this prompt: reuse the verified tokens, but always leave the
    last prompt token to compute (prefill needs its logits), and not below the threshold."""
    ok = verified_tokens(held, chain, prompt_ids, salt)
    usable = min(ok, len(prompt_ids) - 1)
    if usable >= max(threshold, 1):
        return Verdict(outcome="hit", tokens=usable)
    diverged = ok < _comparable(held, len(prompt_ids))  # not just a prompt too short to reuse
    return Verdict(outcome="prefix_mismatch" if diverged else "below_threshold", tokens=0)


def check_params(
    params: dict[str, Any], prompt_ids: list[int], threshold: int, salt: str | None = None
) -> Verdict | None:
    """Prefill: turn a held prefix into what vLLM reads, in place; the verdict, or None when
    the params carry no held prefix. `salt`: the prompt's cache_salt."""
    done = params.get(CHECKED)
    if done is not None:
        return Verdict.model_validate(done)
    raw = params.pop(HELD, None)
    if raw is None:
        return None
    try:
        held = HeldPrefix.model_validate(raw)
        chain = held.chain()
    except ValidationError:
        chain = None
    groups = params.get("remote_block_ids")
    if chain is None or not isinstance(groups, list):
        found = Verdict(outcome="prefix_mismatch", tokens=0)
    else:
        found = verdict(held, chain, prompt_ids, threshold, salt)
        if found.tokens and found.tokens < held.num_tokens and len(groups) != 1:
            # A hybrid model's groups are clipped differently: a cut could name wrong blocks.
            found = Verdict(outcome="prefix_mismatch", tokens=0)
        if found.tokens:
            keep = -(-found.tokens // held.block_size)
            params["remote_block_ids"] = [list(g[:keep]) for g in groups]
    params["remote_num_tokens"] = found.tokens
    params[CHECKED] = found.to_json()  # plain JSON: vLLM may copy the params between processes
    return found


def hold_params(out: dict[str, Any], all_token_ids: Any, block_size: int, salt: str | None = None) -> None:
    """Decode: name the tokens it keeps for the next turn (under the request's cache_salt), and
    let nobody read them unchecked."""
    n = out.get("remote_num_tokens")
    if not out.get("do_remote_decode") or not isinstance(n, int) or n <= 0 or n > len(all_token_ids):
        return
    out[HELD] = held_prefix(list(all_token_ids[:n]), n, block_size, salt).to_json()
    out["remote_num_tokens"] = 0
