"""Every malformed resource of pdx's tests: `pdx render` and the real API server refuse it alike.

The table below is the comparison. Where `note` is empty the two say the very same thing: the
same field path and, for the CEL rules, the same message (the server prefixes "Invalid value: ").
A note says why a difference stays. The table must have a row for every invalid case of
tests/spec/test_validation.py, so a new case there fails here until its row is written.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from pdx import cli
from pdx.rules import MAX_NAME_LENGTH, NAME_PROBLEM
from pdx.spec import API_VERSION, KIND
from tests.apiserver.client import STRICT, Api, cr_path
from tests.spec.test_validation import INVALID, _clean, with_

pytestmark = pytest.mark.apiserver

WORDING = (
    "the OpenAPI validator and pydantic word the same constraint (the CRD's minimum/enum is generated "
    "from the model's Field(ge=...)/Literal) differently; both name the field and the bound"
)
UNKNOWN = "the server reports a field not in the schema without advice; pdx adds the fix"
# Server-side apply builds a typed object from the schema before validating: a wrong JSON type or
# an unknown field fails that step with 500 (create answers 400/422 as in the rows).
SSA_TYPED = "failed to create typed patch object"


@dataclass(frozen=True)
class Row:
    pdx: str  # the line `pdx render` prints for it
    server: tuple[str, str]  # the 422 cause (field, message) on create; for 400 ("", message)
    note: str = ""  # empty: the same field and message
    ssa: str = ""  # server-side apply's own 500 answer, when it does not give the 422 above
    more: tuple[tuple[str, str], ...] = ()  # further causes the server gives


def _cel(field: str, message: str) -> Row:
    return Row(f"spec.{field}: {message}", (f"spec.{field}", f"Invalid value: {message}"))


_TENANCY = (
    "router.tenancy.header names the header of identity 'header', and only of it: set both "
    "(e.g. identity: header, header: X-Tenant), or neither"
)
LONG_NAME = "qwen3-32b-disaggregated-bidirectional-t48"  # 41 characters
_TP = "exceeds the GPUs of one node of placement.instanceType: lower it, or pick an instance type (or placement.gpusPerNode) with enough GPUs"  # noqa: E501
_TOKENIZER = (
    "router.tokenizer 'router' reads the tokenizer from the model cache: set modelCache.claimName and make "
    "model.name a path under modelCache.mountPath (e.g. /models/Qwen3-32B), or use 'engine'"
)
# case -> the comparison. Cases are those of tests/spec/test_validation.py, plus the two below.
TABLE: dict[str, Row] = {
    "TTL below 1": Row(
        "spec.kvTransfer.decoderKvBlocksTtlSeconds: Input should be greater than or equal to 6 (got 0)",
        ("spec.kvTransfer.decoderKvBlocksTtlSeconds",
         "Invalid value: 0: spec.kvTransfer.decoderKvBlocksTtlSeconds in body should be greater than or equal to 6"),
        WORDING,
    ),
    "negative threshold": Row(
        "spec.kvTransfer.kvRecomputeThreshold: Input should be greater than or equal to 0 (got -1)",
        ("spec.kvTransfer.kvRecomputeThreshold",
         "Invalid value: -1: spec.kvTransfer.kvRecomputeThreshold in body should be greater than or equal to 0"),
        WORDING,
    ),
    "lease below a 1 s heartbeat": Row(
        "spec.kvTransfer.kvLeaseDurationSeconds: Input should be greater than or equal to 6 (got 5)",
        ("spec.kvTransfer.kvLeaseDurationSeconds",
         "Invalid value: 5: spec.kvTransfer.kvLeaseDurationSeconds in body should be greater than or equal to 6"),
        WORDING,
    ),
    "lease above an hour": Row(
        "spec.kvTransfer.kvLeaseDurationSeconds: Input should be less than or equal to 3600 (got 3601)",
        ("spec.kvTransfer.kvLeaseDurationSeconds",
         "Invalid value: 3601: spec.kvTransfer.kvLeaseDurationSeconds in body should be less than or equal to 3600"),
        WORDING,
    ),
    "unknown backend": Row(
        "spec.kvTransfer.backends[0]: Input should be 'LIBFABRIC' or 'UCX' (got 'TCP')",
        ("spec.kvTransfer.backends[0]", 'Unsupported value: "TCP": supported values: "LIBFABRIC", "UCX"'),
        WORDING,
    ),
    "typo in a field name": Row(
        "spec.kvTransfer.decoderTtl: unknown field; remove it or fix its spelling (see `kubectl explain dinf.spec`)",
        ("", 'DisaggregatedInference in version "v1alpha1" cannot be handled as a DisaggregatedInference: '
             'strict decoding error: unknown field "spec.kvTransfer.decoderTtl"'),
        UNKNOWN,
        ssa=".spec.kvTransfer.decoderTtl: field not declared in schema",
    ),
    "missing model": Row("spec.model: Field required", ("spec.model", "Required value"), WORDING),
    "router TTL not below decoder TTL minus the decline window": _cel(
        "router.conversationTtlSeconds",
        "router.conversationTtlSeconds must be at most kvTransfer.decoderKvBlocksTtlSeconds - 5 "
        "(prefill declines reads in decode's last 5 s): lower it, or raise the decoder TTL",
    ),
    "prefill TP beyond the node's GPUs": _cel("prefill.tensorParallelSize", f"prefill.tensorParallelSize {_TP}"),
    "decode TP beyond an override of GPUs per node": _cel(
        "decode.tensorParallelSize", f"decode.tensorParallelSize {_TP}"
    ),
    "TP sizes that do not divide one another": _cel(
        "decode.tensorParallelSize",
        "prefill.tensorParallelSize and decode.tensorParallelSize must divide one another "
        "(NixlConnector maps KV heads between ranks by their ratio): e.g. 8 and 4, not 8 and 3",
    ),
    "recompute policy with bidirectional on": _cel(
        "kvTransfer.loadFailurePolicy",
        "kvTransfer.loadFailurePolicy 'recompute' hangs expired D->P reads in vLLM 0.32/0.33: "
        "use 'fail' (the router retries the turn without reuse) or turn bidirectional off",
    ),
    "held KV share of nothing": Row(
        "spec.kvTransfer.heldKvMaxFraction: Input should be greater than 0 (got 0)",
        ("spec.kvTransfer.heldKvMaxFraction",
         "Invalid value: 0: spec.kvTransfer.heldKvMaxFraction in body should be greater than 0"),
        WORDING,
    ),
    "held KV share above the whole cache": Row(
        "spec.kvTransfer.heldKvMaxFraction: Input should be less than or equal to 1 (got 1.5)",
        ("spec.kvTransfer.heldKvMaxFraction",
         "Invalid value: 1.5: spec.kvTransfer.heldKvMaxFraction in body should be less than or equal to 1"),
        WORDING,
    ),
    "held KV share with the valve off": _cel(
        "kvTransfer.heldKvMaxFraction",
        "kvTransfer.heldKvMaxFraction needs releaseUnderPressure: true (the valve releases held KV "
        "above the fraction): remove heldKvMaxFraction, or set releaseUnderPressure: true",
    ),
    "first token from prefill beside a reasoning parser on decode": _cel(
        "router.firstTokenFromPrefill",
        "router.firstTokenFromPrefill needs decode without --reasoning-parser, --tool-call-parser, "
        "--enable-auto-tool-choice, --speculative-config, --logits-processors in model.extraArgs or "
        "decode.extraArgs (decode's first token would not be prefill's, or vLLM refuses the logits processor): "
        "remove those arguments, or set firstTokenFromPrefill: false",
    ),
    "unknown instance type without GPU counts": _cel(
        "placement.instanceType",
        "placement.instanceType has no profile (known: cpu, gpu, p4d.24xlarge, p5.48xlarge, p5e.48xlarge, "
        "p5en.48xlarge): use one of those, or set placement.gpusPerNode and placement.efaDevicesPerNode",
    ),
    "LIBFABRIC without EFA": _cel(
        "kvTransfer.backends",
        "kvTransfer.backends LIBFABRIC needs EFA devices on the node: use UCX, or an instance type "
        "(or placement.efaDevicesPerNode) with EFA",
    ),
    "LIBFABRIC beside another backend on EFA": _cel(
        "kvTransfer.backends",
        "kvTransfer.backends must list LIBFABRIC alone on EFA nodes (the engine refuses to start when NIXL "
        "also instantiates another backend, whose KV would go over TCP), or set placement.efaCheck: false",
    ),
    "redis store without URL": _cel(
        "router.store.url", "router.store.url is required when router.store.kind is redis: set redis://HOST:6379/0"
    ),
    "two routers without a shared store": _cel(
        "router.replicas",
        "router.replicas above 1 needs router.store.kind redis (replicas must share conversation entries): "
        "set the store, or use one replica",
    ),
    "router tokenizer without a model cache PVC": _cel("router.tokenizer", _TOKENIZER),
    "router tokenizer for a hub id, not a path in the cache": _cel("router.tokenizer", _TOKENIZER),
    "unknown tokenizer side": Row(
        "spec.router.tokenizer: Input should be 'engine' or 'router' (got 'client')",
        ("spec.router.tokenizer", 'Unsupported value: "client": supported values: "engine", "router"'),
        WORDING,
    ),
    "gateway identity without its header": _cel("router.tenancy.header", _TENANCY),
    "a tenant header without its identity": _cel("router.tenancy.header", _TENANCY),
    "the deprecated tenantHeader beside tenancy": _cel(
        "router.tenantHeader",
        "router.tenantHeader is the deprecated form of router.tenancy: remove it and set "
        "tenancy.identity: header, tenancy.header: <the header>",
    ),
    "unknown tenant identity": Row(
        "spec.router.tenancy.identity: Input should be 'apiKey', 'header' or 'single' (got 'ip')",
        ("spec.router.tenancy.identity", 'Unsupported value: "ip": supported values: "apiKey", "header", "single"'),
        WORDING,
    ),
    "engine key Secret without a name": Row(
        "spec.engineApiKeySecret.name: Field required", ("spec.engineApiKeySecret.name", "Required value"), WORDING
    ),
    "autoscaling with a max below its min": _cel(
        "decode.autoscaling.maxReplicas",
        "decode.autoscaling.maxReplicas must be at least minReplicas: raise it, or lower minReplicas",
    ),
    "autoscaling without a max": Row(
        "spec.prefill.autoscaling.maxReplicas: Field required",
        ("spec.prefill.autoscaling.maxReplicas", "Required value"),
        WORDING,
    ),
    # tests/render/test_cli_and_golden.py
    "threshold -5 (pdx render's own test)": Row(
        "spec.kvTransfer.kvRecomputeThreshold: Input should be greater than or equal to 0 (got -5)",
        ("spec.kvTransfer.kvRecomputeThreshold",
         "Invalid value: -5: spec.kvTransfer.kvRecomputeThreshold in body should be greater than or equal to 0"),
        WORDING,
    ),
    # Found by the server: lax pydantic took "2" for an integer and "false" for a boolean.
    "replicas given as a string": Row(
        "spec.prefill.replicas: Input should be a valid integer (got '2')",
        ("spec.prefill.replicas",
         'Invalid value: "string": spec.prefill.replicas in body must be of type integer: "string"'),
        WORDING,
        ssa=".spec.prefill.replicas: expected numeric (int or float), got string",
    ),
    "bidirectional given as a string": Row(
        "spec.kvTransfer.bidirectional: Input should be a valid boolean (got 'false')",
        ("spec.kvTransfer.bidirectional",
         'Invalid value: "string": spec.kvTransfer.bidirectional in body must be of type boolean: "string"'),
        WORDING,
        ssa=".spec.kvTransfer.bidirectional: expected boolean, got &{false}",
    ),
    # Found by the server: it took any DNS subdomain as a name; pdx's children need a short DNS label.
    "a name longer than 40 characters": Row(
        f"metadata.name: '{LONG_NAME}' {NAME_PROBLEM}",
        ("metadata.name", f"Invalid value: '{LONG_NAME}' {NAME_PROBLEM}"),
    ),
    "a name with a dot": Row(
        f"metadata.name: 'qwen3.32b' {NAME_PROBLEM}", ("metadata.name", f"Invalid value: 'qwen3.32b' {NAME_PROBLEM}")
    ),
    "a name with capitals": Row(  # the server's check of every object's name comes on top
        f"metadata.name: 'Qwen3' {NAME_PROBLEM}",
        ("metadata.name", f"Invalid value: 'Qwen3' {NAME_PROBLEM}"),
        more=(("metadata.name",
               "Invalid value: \"Qwen3\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
               "characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', "
               "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"),),
    ),
    # tests/operator/test_reconcile.py
    "negative prefill replicas (the operator's invalid edit)": Row(
        "spec.prefill.replicas: Input should be greater than or equal to 0 (got -1)",
        ("spec.prefill.replicas",
         "Invalid value: -1: spec.prefill.replicas in body should be greater than or equal to 0"),
        WORDING,
    ),
}
OK = with_({})
# case -> (metadata.name, spec)
DOCS: dict[str, tuple[str, dict[str, Any]]] = {
    why: ("bad", _clean(with_(cast(dict[str, Any], patch)))) for why, patch, _ in INVALID
}
DOCS["threshold -5 (pdx render's own test)"] = ("bad", with_({"kvTransfer.kvRecomputeThreshold": -5}))
DOCS["negative prefill replicas (the operator's invalid edit)"] = ("bad", with_({"prefill.replicas": -1}))
DOCS["replicas given as a string"] = ("bad", with_({"prefill.replicas": "2"}))
DOCS["bidirectional given as a string"] = ("bad", with_({"kvTransfer.bidirectional": "false"}))
DOCS["a name longer than 40 characters"] = (LONG_NAME, OK)
DOCS["a name with a dot"] = ("qwen3.32b", OK)
DOCS["a name with capitals"] = ("Qwen3", OK)
# The server adds this cause when schema errors kept it from evaluating the CEL rules.
CEL_SKIPPED = (
    "<nil>",
    "Invalid value: null: some validation rules were not checked because the object was invalid; "
    "correct the existing errors to complete validation",
)


def document(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def pdx_render_lines(doc: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """What `pdx render -f FILE` prints for it (exit 2, nothing on stdout)."""
    path = tmp_path / "cr.yaml"
    path.write_text(yaml.safe_dump(doc))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        cli.main(["render", "-f", str(path)])
    out, err = capsys.readouterr()
    assert exited.value.code == cli.EXIT_INVALID and out == ""
    lines = err.splitlines()
    assert lines[0] == "pdx: invalid DisaggregatedInference:"
    return [line.strip() for line in lines[1:]]


def server_causes(code: int, body: Any) -> list[tuple[str, str]]:
    assert isinstance(body, dict) and body.get("kind") == "Status", body
    if code == 400:
        return [("", body["message"])]
    assert code == 422, body
    causes = [(c.get("field", ""), c["message"]) for c in body["details"]["causes"]]
    return [c for c in causes if c != CEL_SKIPPED]


def test_the_table_covers_every_invalid_case_of_the_spec_tests() -> None:
    assert set(TABLE) == set(DOCS) and {why for why, _, _ in INVALID} <= set(DOCS)
    assert len(LONG_NAME) == MAX_NAME_LENGTH + 1


def test_rows_without_a_note_really_say_the_same() -> None:
    for case, row in TABLE.items():
        field, message = row.server
        same = row.pdx == f"{field}: {message.removeprefix('Invalid value: ')}"
        assert same == (not row.note), case


@pytest.mark.parametrize("case", list(TABLE))
def test_pdx_render_and_the_api_server_refuse_it_naming_the_same_field(
    api: Api, case: str, namespace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    row = TABLE[case]
    name, spec = DOCS[case]
    doc = document(name, namespace, copy.deepcopy(spec))
    assert pdx_render_lines(doc, tmp_path, capsys) == [row.pdx]
    # `kubectl create` / client-side `kubectl apply` of a new object: POST, strict field validation
    code, body = api.request("POST", cr_path(namespace), doc, params=STRICT)
    assert sorted(server_causes(code, body)) == sorted([row.server, *row.more])
    if row.server[0]:  # the path pdx names is the server's path
        assert row.pdx.startswith(row.server[0] + ": ")
    else:
        assert row.pdx.split(":")[0] in row.server[1]
    # `kubectl apply --server-side`: the same verdict, or its typed-object step's (see SSA_TYPED)
    code, body = api.apply(doc)
    if row.ssa:
        assert code == 500 and body["message"].startswith(SSA_TYPED), body
        assert body["message"].endswith("): " + row.ssa), body
    else:
        assert sorted(server_causes(code, body)) == sorted([row.server, *row.more])
    assert api.request("GET", cr_path(namespace))[1]["items"] == []  # nothing was stored
