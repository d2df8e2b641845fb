"""The documents the operator and the router exchange, typed once and used by both sides.

- `router_config`: router.json, which the renderer writes into the router's ConfigMap;
- `endpoints`: endpoints.json, the ready engines the operator publishes for the router;
- `stats`: the answer of the router's `GET /v1/pdx/stats`, which the operator reads.

This package imports only pydantic: the operator does not pull in the router's runtime, nor
the router the operator's models.
"""
