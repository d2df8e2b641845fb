"""Tuning TTL, threshold, lease and bidirectional on the real server, as `kubectl edit` and
`kubectl apply --server-side` send it: the edit is stored, bumps the generation, reads back
through pdx's models with the new values, and gives the engines a new config hash."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pdx.render.meta import config_hash
from pdx.resource import load
from tests.apiserver.client import STRICT, Api, cr_path, load_yaml
from tests.apiserver.server import ROOT

pytestmark = pytest.mark.apiserver

EDIT = {
    "decoderKvBlocksTtlSeconds": 600,
    "kvRecomputeThreshold": 128,
    "bidirectional": False,
    "kvLeaseDurationSeconds": 300,
}


def seed(namespace: str) -> dict[str, Any]:
    (doc,) = load_yaml((ROOT / "examples" / "seed-qwen3-32b-1p1d.yaml").read_text())
    doc["metadata"]["namespace"] = namespace
    return doc


def kv(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: obj["spec"]["kvTransfer"][k] for k in EDIT}


def test_kubectl_edit_of_ttl_threshold_and_bidirectional_round_trips(api: Api, namespace: str) -> None:
    doc = seed(namespace)
    code, created = api.apply(doc)
    assert code == 201, created
    path = cr_path(namespace, doc["metadata"]["name"])
    edited = api.get(path)  # kubectl edit: GET, change in the editor, PUT with the resourceVersion read
    edited["spec"]["kvTransfer"].update(EDIT)
    code, stored = api.request("PUT", path, edited, params=STRICT)
    assert code == 200, stored
    assert kv(stored) == EDIT and stored["metadata"]["generation"] == 2
    assert stored["spec"] == {**created["spec"], "kvTransfer": {**created["spec"]["kvTransfer"], **EDIT}}
    before, after = load(created), load(stored)
    assert after.spec.kv_transfer.decoder_kv_blocks_ttl_seconds == 600
    assert after.spec.kv_transfer.kv_recompute_threshold == 128 and after.spec.kv_transfer.bidirectional is False
    assert (before.spec.kv_transfer.kv_lease_duration_seconds, after.spec.kv_transfer.kv_lease_duration_seconds) == (
        120,
        300,
    )
    assert config_hash(after) != config_hash(before)
    # an editor session that read the old version is refused, not merged silently
    code, body = api.request("PUT", path, {**edited, "spec": created["spec"]}, params=STRICT)
    assert code == 409 and body["reason"] == "Conflict", body
    assert kv(api.get(path)) == EDIT


def test_an_edit_the_cel_rules_refuse_leaves_the_stored_object_as_it_was(api: Api, namespace: str) -> None:
    doc = seed(namespace)
    assert api.apply(doc)[0] == 201
    path = cr_path(namespace, doc["metadata"]["name"])
    live = api.get(path)
    bad = copy.deepcopy(live)
    bad["spec"]["kvTransfer"]["decoderKvBlocksTtlSeconds"] = 60
    bad["spec"]["router"]["conversationTtlSeconds"] = 58
    code, body = api.request("PUT", path, bad, params=STRICT)
    assert code == 422 and body["details"]["causes"][0]["field"] == "spec.router.conversationTtlSeconds", body
    assert api.get(path) == live


def test_kubectl_apply_server_side_of_an_edited_manifest_round_trips(api: Api, namespace: str) -> None:
    doc = seed(namespace)
    assert api.apply(doc)[0] == 201
    path = cr_path(namespace, doc["metadata"]["name"])
    tuned = copy.deepcopy(doc)
    tuned["spec"].setdefault("kvTransfer", {}).update(EDIT)
    code, stored = api.apply(tuned)
    assert code == 200, stored
    assert kv(stored) == EDIT and stored["metadata"]["generation"] == 2
    assert load(stored).spec.kv_transfer.decoder_kv_blocks_ttl_seconds == 600
    # applying the same manifest again changes nothing
    code, again = api.apply(tuned)
    assert code == 200 and again["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
    # dropping the lines from the manifest gives the fields back to the schema's defaults
    plain = copy.deepcopy(doc)
    plain["spec"].pop("kvTransfer", None)
    code, reverted = api.apply(plain)
    assert code == 200, reverted
    assert kv(reverted) == {
        "decoderKvBlocksTtlSeconds": 480,
        "kvRecomputeThreshold": 64,
        "bidirectional": True,
        "kvLeaseDurationSeconds": 120,
    }
    assert api.get(path)["metadata"]["generation"] == 3


def test_server_side_apply_over_a_kubectl_edit_is_a_conflict_until_forced(api: Api, namespace: str) -> None:
    """Another manager's edit of a field this manifest sets: kubectl reports the conflict
    (and `--force-conflicts` takes the field over) instead of undoing the edit unseen."""
    doc = seed(namespace)
    doc["spec"]["kvTransfer"] = {"decoderKvBlocksTtlSeconds": 480}
    assert api.apply(doc)[0] == 201
    path = cr_path(namespace, doc["metadata"]["name"])
    code, _ = api.request("PATCH", path, {"spec": {"kvTransfer": {"decoderKvBlocksTtlSeconds": 900}}},
                          params={**STRICT, "fieldManager": "kubectl-edit"},
                          content_type="application/merge-patch+json")  # fmt: skip
    assert code == 200
    doc["spec"]["kvTransfer"]["decoderKvBlocksTtlSeconds"] = 600
    code, body = api.apply(doc)
    assert code == 409 and "decoderKvBlocksTtlSeconds" in body["message"], body
    assert api.get(path)["spec"]["kvTransfer"]["decoderKvBlocksTtlSeconds"] == 900
    code, forced = api.apply(doc, force=True)
    assert code == 200 and forced["spec"]["kvTransfer"]["decoderKvBlocksTtlSeconds"] == 600
