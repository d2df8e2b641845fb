"""Decode continues from the token prefill already sent: a vLLM logits processor that forces a
request's first generated token when the router names it (`router.firstTokenFromPrefill`).

Prefill samples one token for every P/D turn. With the option on, the router streams that token
to the client as soon as prefill answers, instead of waiting for decode's first step, and asks
decode for the rest with `vllm_xargs: {"pdx_first_token": ID}`. Decode must then produce exactly
that token first, so that its own pipeline (detokenizer, stop strings, usage) continues from what
the client already has; every later token is sampled as usual. Only the first output token is
forced: a preempted request recomputed later has output tokens and is left alone.

Rendered on decode only (`--logits-processors pdx_engine.first_token:FirstTokenFromPrefill`):
vLLM refuses custom logits processors with speculative decoding, so it is not loaded by default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from vllm.v1.sample.logits_processor.interface import BatchUpdate, LogitsProcessor, MoveDirectionality

from pdx_contract.first_token import ARG  # the key in a request's vllm_xargs (SamplingParams.extra_args)

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.config import VllmConfig


def forced_token(params: SamplingParams | None) -> int | None:
    """The token a request asks to start with, if any (a bool is not a token id)."""
    extra: dict[str, Any] | None = getattr(params, "extra_args", None)
    value = extra.get(ARG) if extra else None
    return value if type(value) is int and value >= 0 else None


class FirstTokenFromPrefill(LogitsProcessor):
    """Masks every logit but the named token's while a request has generated nothing yet."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        extra = getattr(sampling_params, "extra_args", None) or {}
        if ARG in extra and forced_token(sampling_params) is None:
            raise ValueError(f"vllm_xargs.{ARG}: must be a token id (a non-negative integer), not {extra[ARG]!r}")

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        # batch index -> (the token to force, the request's running output list: vLLM appends to it)
        self.forced: dict[int, tuple[int, list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # it changes what greedy sampling picks

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.forced.pop(index, None)
        for index, params, _, output in batch_update.added:
            token = forced_token(params)
            if token is None:
                self.forced.pop(index, None)
            else:
                self.forced[index] = (token, output)
        for a, b, how in batch_update.moved:
            at_a, at_b = self.forced.pop(a, None), self.forced.pop(b, None)
            if at_a is not None:
                self.forced[b] = at_a
            if how is MoveDirectionality.SWAP and at_b is not None:
                self.forced[a] = at_b
        # a request that has generated its first token needs nothing more
        for index in [i for i, (_, output) in self.forced.items() if output]:
            del self.forced[index]

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.forced:
            return logits
        for index, (token, output) in self.forced.items():
            if output or index >= logits.shape[0] or token >= logits.shape[1]:
                continue
            row = logits[index]
            row.fill_(float("-inf"))
            row[token] = 0.0  # the only finite logit: any sampler picks it (no device sync to keep its value)
        return logits
