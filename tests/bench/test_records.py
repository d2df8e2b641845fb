"""Records carry vLLM's multi-turn `--stats-json-output` fields, in its order, plus pdx's."""

from __future__ import annotations

import ast
import gzip
import json
import os
from dataclasses import fields
from pathlib import Path

import pytest

from pdx_bench.records import (
    VLLM_FIELDS,
    RequestRecord,
    leg_of,
    read_records,
    spread_group_transfer,
    stored,
    stored_files,
    write_records,
)

from .synth import record


def test_first_fields_are_vllms_in_order() -> None:
    names = [f.name for f in fields(RequestRecord)]
    assert tuple(names[: len(VLLM_FIELDS)]) == VLLM_FIELDS
    keys = list(record("on", 1000, 2, 50.0).to_json())
    assert tuple(keys[: len(VLLM_FIELDS)]) == VLLM_FIELDS
    for extra in ("prefill_ms", "reuse", "reused_tokens", "kv_transfer_ms", "kv_transfer_source", "turn", "leg"):
        assert extra in keys


def test_round_trip_and_vllm_records_read(tmp_path: Path) -> None:
    recs = [record("off", 1000, 2, 120.5, prefill=100.0, reuse="miss"), record("on", 1000, 2, 60.0, reuse="hit")]
    path = write_records(tmp_path / "r.json", recs)
    data = json.loads(path.read_text())
    assert isinstance(data, list) and data[0]["ttft_ms"] == 120.5 and data[1]["reuse"] == "hit"
    assert read_records(path) == recs
    # A record as vLLM's own benchmark writes it (its twelve fields only) reads with pdx defaults.
    vllm_only = {k: data[0][k] for k in VLLM_FIELDS}
    rec = RequestRecord.from_json(vllm_only)
    assert rec.ttft_ms == 120.5 and rec.prefill_ms is None and rec.leg == ""
    with pytest.raises(ValueError, match="ttft_ms"):
        RequestRecord.from_json({k: v for k, v in vllm_only.items() if k != "ttft_ms"})


def test_group_transfer_goes_to_hits_only() -> None:
    recs = [record("on", 1, 2, 1, reuse="hit"), record("on", 1, 3, 1, reuse="hit"), record("on", 1, 1, 1, reuse="miss")]
    measured = record("on", 1, 4, 1, reuse="hit", xfer=7.0)
    measured.kv_transfer_source = "request"
    spread_group_transfer([*recs, measured], total_ms=30.0, total_bytes=1000.0)
    assert [r.kv_transfer_ms for r in recs] == [15.0, 15.0, 0.0]
    assert [r.kv_transfer_bytes for r in recs] == [500.0, 500.0, 0.0]
    assert {r.kv_transfer_source for r in recs} == {"group"}
    assert measured.kv_transfer_ms == 7.0 and measured.kv_transfer_source == "request"


def test_prefill_compute_subtracts_transfer() -> None:
    assert record("on", 1, 2, 1, prefill=80.0, xfer=15.0).prefill_compute_ms == 65.0
    assert record("on", 1, 2, 1, prefill=80.0).prefill_compute_ms == 80.0
    assert record("on", 1, 2, 1).prefill_compute_ms is None


def _sdist_script() -> Path | None:
    root = os.environ.get("PDX_VLLM_SDIST")
    if not root:
        return None
    path = Path(root) / "benchmarks" / "multi_turn" / "benchmark_serving_multi_turn.py"
    return path if path.exists() else None


@pytest.mark.skipif(_sdist_script() is None, reason="set PDX_VLLM_SDIST to an unpacked vLLM sdist to compare")
def test_fields_match_the_vllm_sdist() -> None:
    """Read RequestStats' field names from vLLM's own script (parsed, never imported or copied)."""
    script = _sdist_script()
    assert script is not None
    tree = ast.parse(script.read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "RequestStats")
    names = tuple(n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))
    assert names == VLLM_FIELDS


def test_gzipped_records_read_as_the_plain_file_and_are_found_beside_plain_ones(tmp_path: Path) -> None:
    recs = [record("off", 1000, 1, 120.5), record("on", 1000, 2, 60.0, reuse="hit")]
    plain = write_records(tmp_path / "records-off.json", recs)
    zipped = tmp_path / "records-on.json.gz"
    zipped.write_bytes(gzip.compress(plain.read_bytes()))
    assert read_records(zipped) == recs
    assert stored(tmp_path / "records-on.json") == zipped
    assert stored(tmp_path / "records-off.json") == plain
    assert stored(tmp_path / "records-bound.json") is None
    assert stored_files(tmp_path, "records") == [plain, zipped]
    assert [leg_of(p) for p in stored_files(tmp_path, "records")] == ["off", "on"]
