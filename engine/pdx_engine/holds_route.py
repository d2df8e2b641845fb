"""``POST /v1/pdx/holds`` on vLLM's API server: the router claims decode's held KV here.

The holds live in the engine core's scheduler (`pdx_engine.held_kv`); the route forwards the
request as a utility call to the engine core, which answers between two steps. Added by
wrapping vLLM's ``build_app`` when its module is imported (0.32 and 0.26 keep it in different
modules), so it needs no endpoint-plugin allowlist. A decode without the route answers 404: the
router then reads its holds as before, without claims. ``GET /v1/pdx/load`` (`pdx_engine.load_route`)
is added with it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from pydantic import ValidationError

from pdx_contract import holds as contract
from pdx_contract import load
from pdx_contract.base import problems
from pdx_engine import load_route

logger = logging.getLogger("vllm.pdx_plugin")

# Where vLLM defines or imports its FastAPI app's builder: 0.32 defines it in launchers.app and
# its server (launchers.api_server.entry) imports it by name, possibly before plugins load, so
# each module's own name is patched; 0.26 defines and calls it in the OpenAI server module.
MODULES = (
    "vllm.entrypoints.launchers.app",
    "vllm.entrypoints.launchers.api_server.entry",
    "vllm.entrypoints.openai.api_server",
)
UTILITY = "pdx_holds"  # the EngineCore method held_kv adds and this route calls
_MARK = "_pdx_holds_route"


async def call_engine(app_state: Any, body: dict[str, Any]) -> dict[str, Any]:
    """The engine core's answer to ``body`` (AsyncLLM's utility call)."""
    core = app_state.engine_client.engine_core
    out: dict[str, Any] = await core.call_utility_async(UTILITY, body)
    return out


def add_route(app: Any, call: Callable[[Any, dict[str, Any]], Any] = call_engine) -> None:
    """A plain Starlette route: the handler gets the request itself, no FastAPI parameters."""
    from starlette.responses import JSONResponse

    async def holds(request: Any) -> Any:
        try:
            asked = contract.HoldsRequest.model_validate_json(await request.body())
        except ValidationError as err:
            return JSONResponse({"error": "; ".join(problems(err))}, status_code=400)
        return JSONResponse(await call(request.app.state, asked.to_json()))

    app.add_route(contract.PATH, holds, methods=["POST"])


def patch_module(module: ModuleType) -> bool:
    """Wrap ``module.build_app`` (its own name for vLLM's builder); True if wrapped now."""
    build = getattr(module, "build_app", None)
    if build is None or getattr(build, _MARK, False):
        return False

    @functools.wraps(build)
    def build_app(*args: Any, **kwargs: Any) -> Any:
        app = build(*args, **kwargs)
        add_route(app)
        load_route.add_route(app)
        return app

    setattr(build_app, _MARK, True)
    module.build_app = build_app  # type: ignore[attr-defined]
    logger.info(
        "pdx plugin: %s serves %s (claims on decode's held KV) and %s", module.__name__, contract.PATH, load.PATH
    )
    return True


def register() -> None:
    from pdx_engine.import_hook import module_exists, on_import

    found = [m for m in MODULES if module_exists(m)]
    if not found:
        logger.error("pdx plugin: this vLLM has none of %s; no %s route", MODULES, contract.PATH)
        return
    for module in found:
        on_import(module, patch_module)
