"""router.firstTokenFromPrefill: one field renders decode's logits processor and the router's
switch together, and a decode whose first token would not simply be the one it is told (a parser,
speculative decoding, logits processors of its own) is refused by the models and the API server."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pdx.render import render
from pdx.render.engines import FIRST_TOKEN_PROCESSOR
from pdx.resource import SpecError, Target, parse_spec
from tests.spec.k8s_api import api_server_errors
from tests.spec.test_validation import _clean, with_

FIELD = "spec.router.firstTokenFromPrefill"
ON = {"router.firstTokenFromPrefill": True}


def _args_and_router(patch: dict[str, Any]) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Each engine's container args, and the router's router.json, for a spec."""
    objects = render(Target("qwen", "inference", parse_spec(_clean(with_(patch)))))
    args = {
        o["metadata"]["name"].rsplit("-", 1)[-1]: o["spec"]["template"]["spec"]["containers"][0]["args"]
        for o in objects
        if o["kind"] == "StatefulSet"
    }
    configmap = next(o for o in objects if o["kind"] == "ConfigMap" and "router.json" in o.get("data", {}))
    return args, json.loads(configmap["data"]["router.json"])


def test_the_switch_renders_decodes_processor_and_the_routers_flag_together() -> None:
    args, router = _args_and_router(ON)
    assert FIRST_TOKEN_PROCESSOR in " ".join(args["decode"]) and FIRST_TOKEN_PROCESSOR not in " ".join(args["prefill"])
    assert router["firstTokenFromPrefill"] is True
    args, router = _args_and_router({})
    assert not any(FIRST_TOKEN_PROCESSOR in " ".join(a) for a in args.values())
    assert router["firstTokenFromPrefill"] is False


CONFLICTS = [
    ("a reasoning parser on decode", {"decode.extraArgs": ["--reasoning-parser", "qwen3"]}),
    ("a tool parser in the model's args", {"model.extraArgs": ["--enable-auto-tool-choice"]}),
    ("speculative decoding as --flag=value", {"decode.extraArgs": ['--speculative-config={"method":"ngram"}']}),
    ("decode's own logits processors", {"decode.extraArgs": ["--logits-processors", "mine:Proc"]}),
]


@pytest.mark.parametrize(("why", "patch"), CONFLICTS, ids=[c[0] for c in CONFLICTS])
def test_a_decode_whose_first_token_is_not_simply_prefills_is_refused_naming_the_field_and_the_fix(
    why: str, patch: dict[str, Any]
) -> None:
    spec = _clean(with_({**ON, **patch}))
    with pytest.raises(SpecError) as err:
        parse_spec(spec)
    problem = next(p for p in err.value.problems if p.startswith(FIELD))
    assert "remove those arguments, or set firstTokenFromPrefill: false" in problem, why
    assert FIELD in api_server_errors(spec), why
    parse_spec(_clean(with_(patch)))  # the same arguments with the switch off: accepted


def test_a_reasoning_parser_on_prefill_alone_is_accepted() -> None:
    parse_spec(_clean(with_({**ON, "prefill.extraArgs": ["--reasoning-parser", "qwen3"]})))
