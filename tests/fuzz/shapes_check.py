"""The request-shape target: what the router makes of a client's body and headers."""

from __future__ import annotations

import re
from typing import Any

import orjson
from multidict import CIMultiDict

from pdx_contract.first_token import ARG as FIRST_TOKEN_ARG
from pdx_contract.router_config import TenancyConfig
from pdx_router.policy import shapes

FRONTS = (
    shapes.Front(TenancyConfig(identity="single")),
    shapes.Front(TenancyConfig(identity="apiKey")),
    shapes.Front(TenancyConfig(identity="header", header="X-Tenant"), engine_key="k"),
    shapes.Front(TenancyConfig(identity="single"), conversation_from="id"),
)
# "field: must be ...", or "messages[2]: must be ...", or "Header: header sent 2 times; send it once"
_NAMED = re.compile(r"(?P<field>[A-Za-z_]+(?:\[\d+\])?|[A-Za-z-]+): (must|required|header sent \d+ times; send)")


def check_shapes(body: dict[str, Any], headers: list[tuple[str, str]], is_chat: bool, front: shapes.Front) -> None:
    """A body of any JSON shape is served or refused with a message naming the field and what
    it must be, never an exception of another kind; what is served never lets the client
    steer KV (kv_transfer_params, in the body or vllm_xargs), and each hop's body serialises."""
    problem = shapes.request_problem(body, is_chat)
    if problem is not None:
        named = _NAMED.match(problem)
        assert named is not None, f"request_problem said {problem!r}: no field named, or no fix"
        field = named.group("field").split("[")[0]
        assert field in body or field == "messages", f"{problem!r} names a field the body does not have"
    path = "/v1/chat/completions" if is_chat else "/v1/completions"
    try:
        req = shapes.client_request(body, CIMultiDict(headers), path, is_chat, front, "rid")
    except shapes.BadRequest as exc:
        assert _NAMED.match(str(exc)), f"BadRequest {exc} names no field"
        duplicated = len({k.lower() for k, _ in headers}) < len(headers)
        assert problem is not None or duplicated, f"refused {body!r} for {exc}, which request_problem passed"
        return
    assert problem is None, f"served a body request_problem refused: {problem}"
    assert "kv_transfer_params" not in req.body and "conversation_id" not in req.body
    xargs = req.body.get("vllm_xargs")
    assert not (isinstance(xargs, dict) and "kv_transfer_params" in xargs), "kv_transfer_params through vllm_xargs"
    assert not (isinstance(xargs, dict) and FIRST_TOKEN_ARG in xargs), "decode's first token set by a client"
    assert req.stream is (body.get("stream") is True), f"stream read as {req.stream} from {body.get('stream')!r}"
    _, pbody = shapes.prefill_request(req, None, None)
    assert pbody["kv_transfer_params"] == shapes.FRESH_PREFILL_KV and pbody["stream"] is False
    dbody = shapes.decode_request(req, None, None)
    assert "kv_transfer_params" not in dbody, "decode would read KV the client named"
    orjson.dumps(pbody)
    orjson.dumps(dbody)
