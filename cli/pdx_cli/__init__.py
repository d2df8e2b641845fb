"""`pdx`, the command line: the API's commands (render, crd, local) and the benchmark's (bench).

It sits above both packages so that neither imports the other's command line: pdx_bench
depends on pdx, and pdx knows nothing of pdx_bench.
"""

from __future__ import annotations

from pdx import cli
from pdx_bench.cli import add_parser as add_bench


def main(argv: list[str] | None = None) -> None:
    cli.main(argv, add_bench)
