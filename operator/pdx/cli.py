"""`pdx`: render manifests, write the CRD, run the topology locally, benchmark it."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from pathlib import Path

import yaml

from pdx.resource import SpecError, Target, load, manifest_documents

EXIT_INVALID = 2


def read_target(path: str) -> Target:
    """Load one DisaggregatedInference from a YAML file (or `-` for stdin)."""
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    try:
        docs = manifest_documents(text)  # a duplicate key is an error, as in kubectl
    except yaml.YAMLError as err:
        raise SpecError([f"{path}: not valid YAML: {err}"]) from None
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise SpecError([f"{path}: expected exactly one DisaggregatedInference document, found {len(docs)}"])
    return load(docs[0])


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


# Subcommands whose modules pull in heavy imports; each module offers add_parser(sub).
_PLUGGED = {"local": "pdx.local.cli", "bench": "pdx_bench.cli"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pdx", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("render", help="print the manifests of a DisaggregatedInference")
    r.add_argument("-f", "--file", required=True, help="CR YAML file, or - for stdin")
    r.set_defaults(run=_render)
    c = sub.add_parser("crd", help="print (or --write) the CustomResourceDefinition")
    c.add_argument("--write", nargs="?", const="-", help="write to crds/ (or the given path)")
    c.set_defaults(run=_crd)
    for module in _PLUGGED.values():
        try:
            importlib.import_module(module).add_parser(sub)
        except ModuleNotFoundError as err:
            if err.name is None or not module.startswith(err.name):
                raise  # a real missing dependency, not a subcommand absent from this install
    return p


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C, so `with LocalTopology(...)` stops the engines it started."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
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
    raise SystemExit(code)
