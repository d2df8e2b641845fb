"""``GET /v1/pdx/load`` on vLLM's API server: decode's requests in flight, for the router's
decode-local rule, without rendering ``/metrics`` (`pdx_contract.load` says why). Installed with
``POST /v1/pdx/holds`` (`pdx_engine.holds_route` wraps vLLM's app builder for both)."""

from __future__ import annotations

from typing import Any

from pdx_contract import load as contract


def unfinished(app_state: Any) -> int | None:
    """The API server's unfinished requests (its output processor's books; the same on vLLM
    0.26 and 0.32); None when this vLLM keeps them elsewhere."""
    processor = getattr(getattr(app_state, "engine_client", None), "output_processor", None)
    count = getattr(processor, "get_num_unfinished_requests", None)
    return int(count()) if callable(count) else None


def add_route(app: Any) -> None:
    """A plain Starlette route; 501 where the count cannot be had (the router then reads
    ``/metrics``, as before this route)."""
    from starlette.responses import JSONResponse

    async def load(request: Any) -> Any:
        n = unfinished(request.app.state)
        if n is None:
            return JSONResponse({"error": "this vLLM keeps no count of unfinished requests"}, status_code=501)
        return JSONResponse(contract.LoadAnswer(requests=n).to_json())

    app.add_route(contract.PATH, load, methods=["GET"])
