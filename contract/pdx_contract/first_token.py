"""Prefill's first token, handed on to decode (`router.firstTokenFromPrefill`): the router names
the token the client already has in the decode request's `vllm_xargs` under `ARG`, and decode's
logits processor (`pdx_engine.first_token`) makes it the request's first output. The router alone
sets it: a client's own is dropped on arrival (`pdx_router.policy.shapes.clean_client_body`)."""

from __future__ import annotations

from typing import Final

ARG: Final = "pdx_first_token"
