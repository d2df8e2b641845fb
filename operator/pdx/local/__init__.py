"""The local runtime: the rendered topology as processes on one machine (`pdx local`)."""

from __future__ import annotations

from importlib import resources
from typing import Any

from pdx.resource import manifest_documents


def default_document() -> dict[str, Any]:
    """The embedded default CR (examples/local-cpu.yaml is the same file)."""
    text = resources.files("pdx").joinpath("data/local-cpu.yaml").read_text()
    (doc,) = manifest_documents(text)  # as kubectl reads it: a duplicate key is an error
    assert isinstance(doc, dict)
    return doc
