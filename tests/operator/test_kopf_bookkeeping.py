"""kopf's bookkeeping kept in memory (pdx.controller.bookkeeping) answers as kopf's own does:
the diff-base essence, the handler progress, and kopf's watch lines parsed through orjson. In
annotations each create and edit cost a PATCH of the CR and one more watch event for kopf to
process; that kopf writes nothing on the CR is checked on the real API server
(tests/cluster/test_operator_in_process.py)."""

from __future__ import annotations

import copy
from typing import Any, cast

from tests.operator.conftest import cr_document


def test_the_in_memory_diffbase_builds_the_essence_kopf_builds() -> None:
    """It skips copying the status and system metadata; what kopf compares stays the same."""
    import kopf

    from pdx import labels
    from pdx.controller.bookkeeping import MemoryDiffBaseStorage

    raw = {
        **cr_document(),
        "status": {"ready": "True", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    raw["metadata"] = {
        **raw["metadata"],
        "uid": "u1",
        "resourceVersion": "7",
        "generation": 2,
        "finalizers": ["pdx.dev/operator"],
        "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
        "labels": {"team": "search"},
        "annotations": {
            "pdx.dev/kopf-managed": "yes",
            "pdx.dev/converge": "{}",
            "kubectl.kubernetes.io/last-applied-configuration": "{}",
            "note": "kept",
        },
    }
    body = kopf.Body(cast(kopf.RawBody, raw))
    ours = MemoryDiffBaseStorage().build(body=body)
    assert ours == kopf.AnnotationsDiffBaseStorage(prefix=labels.KOPF_PREFIX).build(body=body)
    assert ours == {"spec": raw["spec"], "metadata": {"labels": {"team": "search"}, "annotations": {"note": "kept"}}}


def test_the_in_memory_essence_is_a_copy_also_of_what_orjson_cannot_encode() -> None:
    """kopf compares a stored essence with later ones: a change to the body must not reach it,
    whether copied through orjson or, for an integer beyond 64 bits, through deepcopy; a body
    without labels or annotations gives kopf's essence too."""
    import kopf

    from pdx import labels
    from pdx.controller.bookkeeping import MemoryDiffBaseStorage

    for extra in ({}, {"huge": 2**70}):
        raw: dict[str, Any] = {**cr_document(), "status": {"ready": "False"}}
        raw["metadata"] = {"name": "demo", "namespace": "inference", "uid": "u1"}
        raw["spec"] = {**copy.deepcopy(raw["spec"]), **extra}
        body = kopf.Body(cast(kopf.RawBody, raw))
        ours = MemoryDiffBaseStorage().build(body=body)
        assert ours == kopf.AnnotationsDiffBaseStorage(prefix=labels.KOPF_PREFIX).build(body=body)
        before = copy.deepcopy(ours)
        raw["spec"]["prefill"]["replicas"] = 7
        assert ours == before


def test_the_in_memory_progress_clears_as_kopf_does_and_copies_only_what_it_changes() -> None:
    """kopf's annotations storage deep-copies every essence it clears (twice per CR event);
    ours answers the same essence, and one with nothing to remove is not copied."""
    import kopf

    from pdx import labels
    from pdx.controller.bookkeeping import MemoryProgressStorage

    ours = MemoryProgressStorage(prefix=labels.KOPF_PREFIX)
    kopfs = kopf.AnnotationsProgressStorage(prefix=labels.KOPF_PREFIX)
    spec = cr_document()["spec"]
    cases: list[dict[str, Any]] = [
        {"spec": spec, "metadata": {"labels": {"team": "search"}, "annotations": {"note": "kept"}}},
        {"spec": spec, "metadata": {"annotations": {"pdx.dev/touch-dummy": "x", "note": "kept"}}},
        {"spec": spec, "metadata": {"annotations": {"pdx.dev/touch-dummy": "x"}}},
        {"spec": spec, "metadata": {"labels": {}, "annotations": {"note": "kept"}}},
        {"spec": spec, "metadata": {}},
        {"spec": spec, "status": {}},
        {"spec": spec},
    ]
    for essence in cases:
        before = copy.deepcopy(essence)
        cleared = ours.clear(essence=cast(kopf.BodyEssence, essence))
        assert cleared == kopfs.clear(essence=cast(kopf.BodyEssence, copy.deepcopy(before))), essence
        assert essence == before  # the essence given is never changed
    plain = cast(kopf.BodyEssence, cases[0])
    assert ours.clear(essence=plain) is plain


def test_kopf_parses_its_watch_lines_through_the_installed_parse_as_json_would() -> None:
    """The same objects as json.loads (non-ASCII, numbers, nesting), json's error for a bad
    line, and json's answer where only it accepts the line (NaN)."""
    import json

    import pytest
    from kopf._cogs.clients import api

    from pdx.controller import kopfjson

    assert kopfjson.install()
    parse = vars(api)["json"].loads  # the name kopf's watch calls
    assert parse is kopfjson.loads
    lines = [
        '{"type":"ADDED","object":{"metadata":{"name":"d\\u00e9mo","uid":"u1"},"spec":{"x":[1,2.5,-3e-7,null,true]}}}',
        '{"type":"MODIFIED","object":{"note":"\u00fcber \\"quoted\\"","n":9223372036854775807}}',
    ]
    for line in lines:
        assert parse(line) == json.loads(line)
    assert str(parse('{"v":NaN}')["v"]) == "nan"
    with pytest.raises(json.JSONDecodeError):
        parse('{"type":')
