"""Block arithmetic for the KV a reused turn reads (the prefix check itself is `ids.compare`)."""

from __future__ import annotations


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Number of KV blocks that hold num_tokens tokens."""
    return -(-num_tokens // block_size)


_CANDIDATE_BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


def infer_block_size(num_tokens: int, num_blocks: int) -> int | None:
    """Guess the engine's block size from a stored entry, or None if ambiguous.

    Only used when the decode's /metrics did not tell us; an ambiguous guess would point
    prefill at the wrong blocks, so ambiguity means 'do not cut'.
    """
    fits = [
        bs
        for bs in _CANDIDATE_BLOCK_SIZES
        if blocks_for(num_tokens, bs) <= num_blocks <= blocks_for(num_tokens + 1, bs)
    ]
    return fits[0] if len(fits) == 1 else None
