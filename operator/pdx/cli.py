"""The API's commands: render manifests, write the CRD, run the topology locally.

The `pdx` command (pdx_cli) adds them beside the benchmark's; `python -m pdx` has these alone.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from pdx.local.gpus import GpuPlanError
from pdx.resource import SpecError, read_target

EXIT_INVALID = 2


def _render(args: argparse.Namespace) -> int:
    from pdx.render import render

    target = read_target(args.file)
    objects = render(target)
    # Everything is rendered before anything is printed: bad input prints nothing.
    sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False, width=1000))
    return 0


def _crd(args: argparse.Namespace) -> int:
    from pdx.crd import CRD_FILE, crd_yaml

    text = crd_yaml()
    if args.write:
        Path(args.write if args.write != "-" else CRD_FILE).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def add_commands(sub: Any) -> None:
    """render, crd and local, onto an argparse subparsers object."""
    from pdx.local import cli as local_cli

    r = sub.add_parser("render", help="print the manifests of a DisaggregatedInference")
    r.add_argument("-f", "--file", required=True, help="CR YAML file, or - for stdin")
    r.set_defaults(run=_render)
    c = sub.add_parser("crd", help="print (or --write) the CustomResourceDefinition")
    c.add_argument("--write", nargs="?", const="-", help="write to crds/ (or the given path)")
    c.set_defaults(run=_crd)
    local_cli.add_parser(sub)


def parser(*more: Callable[[Any], None]) -> argparse.ArgumentParser:
    """`pdx` with the API's commands, then each of `more` (an add_parser of another package)."""
    p = argparse.ArgumentParser(prog="pdx", description="pdx: render manifests, write the CRD, run locally, benchmark.")
    sub = p.add_subparsers(dest="command", required=True)
    add_commands(sub)
    for add in more:
        add(sub)
    return p


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C, so `with LocalTopology(...)` stops the engines it started."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None, *more: Callable[[Any], None]) -> None:
    args = parser(*more).parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        code = args.run(args)
    except SpecError as err:
        print("pdx: invalid DisaggregatedInference:", file=sys.stderr)
        for problem in err.problems:
            print(f"  {problem}", file=sys.stderr)
        code = EXIT_INVALID
    except FileNotFoundError as err:
        print(f"pdx: {err.strerror}: {err.filename}", file=sys.stderr)
        code = EXIT_INVALID
    except GpuPlanError as err:  # the resource asks for GPUs this machine cannot give
        print(f"pdx local: {err}", file=sys.stderr)
        code = EXIT_INVALID
    raise SystemExit(code)
