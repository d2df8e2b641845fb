"""GET /v1/pdx/load on vLLM's API server: the requests its output processor has unfinished,
or 501 (the router then reads /metrics) where this vLLM keeps no such count."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from starlette.applications import Starlette
from starlette.testclient import TestClient

from pdx_contract import load as contract
from pdx_engine import holds_route, load_route


def app_with(engine_client: Any) -> Starlette:
    app = Starlette()
    app.state.engine_client = engine_client
    load_route.add_route(app)
    return app


def test_the_load_is_the_api_server_s_unfinished_requests() -> None:
    processor = SimpleNamespace(get_num_unfinished_requests=lambda: 3)
    answer = TestClient(app_with(SimpleNamespace(output_processor=processor))).get(contract.PATH)
    assert answer.status_code == 200
    assert contract.LoadAnswer.model_validate_json(answer.content).requests == 3


def test_a_vllm_without_the_count_answers_501_so_the_router_reads_its_metrics() -> None:
    answer = TestClient(app_with(SimpleNamespace())).get(contract.PATH)
    assert answer.status_code == 501 and "unfinished" in answer.json()["error"]


def test_the_app_builder_that_adds_the_holds_route_adds_the_load_route_too() -> None:
    module = SimpleNamespace(__name__="fake_vllm_app", build_app=lambda *a, **k: Starlette())
    assert holds_route.patch_module(module)  # type: ignore[arg-type]
    paths = {getattr(r, "path", None) for r in module.build_app().routes}
    assert {contract.PATH, "/v1/pdx/holds"} <= paths
