"""`pdx render` and `pdx crd`: golden output for the seed's setups, clean failure on bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdx.crd import crd_yaml

ROOT = Path(__file__).parents[2]
GOLDEN = ROOT / "tests" / "golden"
CASES = ["seed-qwen3-32b-1p1d", "qwen3-32b-2p2d"]


def pdx(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pdx", *args], input=stdin, capture_output=True, text=True, cwd=ROOT, check=False
    )


@pytest.mark.parametrize("name", CASES)
def test_render_of_the_seed_setups_matches_the_golden_files(name: str) -> None:
    result = pdx("render", "-f", f"examples/{name}.yaml")
    assert result.returncode == 0, result.stderr
    golden = GOLDEN / f"{name}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(result.stdout)
    assert result.stdout == golden.read_text(), "re-run with UPDATE_GOLDEN=1 after an intended change"


def test_committed_crd_equals_the_one_generated_from_the_models() -> None:
    assert (ROOT / "crds" / "disaggregatedinferences.yaml").read_text() == crd_yaml(), "run `pdx crd --write`"


def test_invalid_input_exits_2_names_the_field_and_prints_no_manifest() -> None:
    bad = """
apiVersion: inference.pdx.dev/v1alpha1
kind: DisaggregatedInference
metadata: {name: demo}
spec:
  model: {name: Qwen/Qwen3-32B}
  kvTransfer: {kvRecomputeThreshold: -5}
"""
    result = pdx("render", "-f", "-", stdin=bad)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "spec.kvTransfer.kvRecomputeThreshold" in result.stderr


def test_a_file_with_two_documents_is_refused() -> None:
    text = (ROOT / "examples" / "local-cpu.yaml").read_text()
    result = pdx("render", "-f", "-", stdin=text + "\n---\n" + text)
    assert result.returncode == 2 and result.stdout == ""
    assert "exactly one" in result.stderr


def test_a_missing_file_is_reported_without_a_traceback() -> None:
    result = pdx("render", "-f", "nope.yaml")
    assert result.returncode == 2 and "Traceback" not in result.stderr and "nope.yaml" in result.stderr


def test_every_crd_field_has_a_description_for_kubectl_explain() -> None:
    import yaml

    schema = yaml.safe_load(crd_yaml())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    missing: list[str] = []

    def walk(node: dict[str, object], path: str) -> None:
        props = node.get("properties")
        if isinstance(props, dict):
            for name, sub in props.items():
                if not sub.get("description"):
                    missing.append(f"{path}.{name}")
                walk(sub, f"{path}.{name}")

    walk(schema, "spec")
    assert missing == []
