"""The local runtime: the rendered topology as processes on one machine (`pdx local`)."""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml


def default_document() -> dict[str, Any]:
    """The embedded default CR (examples/local-cpu.yaml is the same file)."""
    text = resources.files("pdx").joinpath("data/local-cpu.yaml").read_text()
    doc: dict[str, Any] = yaml.safe_load(text)
    return doc
