"""The real API server accepts pdx's CRDs and every example, and defaults specs as the models do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pdx import cli
from pdx.resource import parse_spec
from pdx.spec import PLURAL
from tests.apiserver.client import CRD_FILES, STRICT, Api, cr_path, established, load_yaml
from tests.apiserver.server import ROOT
from tests.spec.test_validation import VALID, with_

pytestmark = pytest.mark.apiserver

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def model_defaults(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec as pdx's models complete it: what the operator renders from."""
    return parse_spec(spec).model_dump(by_alias=True, exclude_none=True, mode="json")


DUPLICATE = """apiVersion: inference.pdx.dev/v1alpha1
kind: DisaggregatedInference
metadata: {name: demo}
spec:
  model: {name: Qwen/Qwen3-32B}
  kvTransfer:
    bidirectional: true
    bidirectional: false
"""


def test_the_kubectl_reader_refuses_a_duplicate_key() -> None:
    with pytest.raises(yaml.constructor.ConstructorError, match="duplicate key 'bidirectional'"):
        load_yaml(DUPLICATE)


def test_pdx_render_refuses_a_duplicate_key_as_kubectl_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text(DUPLICATE)
    with pytest.raises(SystemExit) as exited:
        cli.main(["render", "-f", str(path)])
    out, err = capsys.readouterr()
    assert exited.value.code == cli.EXIT_INVALID and out == ""
    assert "not valid YAML" in err and "duplicate key 'bidirectional'" in err


@pytest.mark.parametrize("path", CRD_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_crd_file_is_accepted_and_established(api: Api, path: Path) -> None:
    for doc in load_yaml(path.read_text()):
        crd = established(api, doc["metadata"]["name"])  # the session fixture applied it
        # the server stores what the file says: nothing of it was pruned or refused
        for want, have in zip(doc["spec"]["versions"], crd["spec"]["versions"], strict=True):
            assert have["schema"] == want["schema"], (path, want["name"])
            assert have.get("additionalPrinterColumns", []) == want.get("additionalPrinterColumns", [])
            assert have.get("subresources") == want.get("subresources")
        conds = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conds.get("NonStructuralSchema") is None, conds  # a structural schema
        assert conds["NamesAccepted"] == "True"


def test_the_dinf_api_is_served_with_its_short_name(api: Api) -> None:
    resources = api.get("/apis/inference.pdx.dev/v1alpha1")["resources"]
    main = next(r for r in resources if r["name"] == PLURAL)
    assert main["shortNames"] == ["dinf"] and main["namespaced"] is True
    assert f"{PLURAL}/status" in [r["name"] for r in resources]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_applied_strictly_and_stored_as_the_models_default_it(
    api: Api, path: Path, namespace: str
) -> None:
    (doc,) = load_yaml(path.read_text())  # one document, no duplicate key
    doc["metadata"]["namespace"] = namespace
    code, stored = api.apply(doc)
    assert code == 201, stored
    assert stored["spec"] == model_defaults(doc["spec"])
    again = api.get(cr_path(namespace, doc["metadata"]["name"]))
    assert again["spec"] == stored["spec"] and again["metadata"]["generation"] == 1


@pytest.mark.parametrize(("why", "patch"), VALID, ids=[c[0] for c in VALID])
def test_every_valid_spec_of_the_spec_tests_is_accepted_and_defaulted_alike(
    api: Api, why: str, patch: dict[str, Any], namespace: str
) -> None:
    spec = with_(patch)
    doc = {"apiVersion": "inference.pdx.dev/v1alpha1", "kind": "DisaggregatedInference",
           "metadata": {"name": "valid", "namespace": namespace}, "spec": spec}  # fmt: skip
    code, stored = api.apply(doc)
    assert code == 201, (why, stored)
    assert stored["spec"] == model_defaults(spec), why


# What the server takes beyond strict JSON types, found by trying: pdx takes it alike. The last
# flag: server-side apply refuses it even so (a null map value: "must be of type string"), while
# create and update (kubectl create, edit, client-side apply) drop it.
LENIENT = [
    ("a null field is dropped, then defaulted", {"model": {"name": "m"}, "prefill": {"replicas": None}}, False),
    ("a null section is dropped, then defaulted", {"model": {"name": "m"}, "kvTransfer": None}, False),
    ("a whole number written 2.0 is an integer", {"model": {"name": "m"}, "prefill": {"replicas": 2.0}}, False),
    ("a null value in a map is dropped", {"model": {"name": "m"}, "decode": {"env": {"A": None, "B": "1"}}}, True),
]


@pytest.mark.parametrize(("why", "spec", "ssa_refuses"), LENIENT, ids=[c[0] for c in LENIENT])
def test_what_the_server_takes_beyond_strict_types_pdx_takes_alike(
    api: Api, why: str, spec: dict[str, Any], ssa_refuses: bool, namespace: str
) -> None:
    doc: dict[str, Any] = {"apiVersion": "inference.pdx.dev/v1alpha1", "kind": "DisaggregatedInference",
                           "metadata": {"name": "lenient", "namespace": namespace}, "spec": spec}  # fmt: skip
    code, stored = api.request("POST", cr_path(namespace), doc, params=STRICT)
    assert code == 201, (why, stored)
    assert stored["spec"] == model_defaults(spec), why
    doc["metadata"]["name"] = "lenient-applied"
    code, applied = api.apply(doc)
    if ssa_refuses:
        assert code == 422 and applied["details"]["causes"][0]["field"] == "spec.decode.env.A", applied
    else:
        assert code == 201 and applied["spec"] == stored["spec"], (why, applied)
