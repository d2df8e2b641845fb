"""The documents the operator and the router exchange, typed once and used by both sides.

- `router_config`: router.json, which the renderer writes into the router's ConfigMap;
- `endpoints`: endpoints.json, the ready engines the operator publishes for the router;
- `stats`: the answer of the router's `GET /v1/pdx/stats`, which the operator reads;
- `kv_prefix`: what the engines' plugin adds to `kv_transfer_params` (the tokens decode holds,
  prefill's verdict on them), which the router stores and reads.

This package imports only pydantic (and the standard library): the operator does not pull in the router's runtime, nor
the router the operator's models.
"""
