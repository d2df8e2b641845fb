"""`pdx local up|down|plan`: the rendered topology as local processes."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

from pdx.local import default_document
from pdx.resource import manifest_documents, read_target


def read_document(path: str | None) -> dict[str, Any]:
    if path is None:
        return default_document()
    read_target(path)  # validates: SpecError reaches the CLI's error reporting
    (doc,) = manifest_documents(Path(path).read_text())  # read_target checked: one mapping
    assert isinstance(doc, dict)
    return doc


def _up(args: argparse.Namespace) -> int:
    from pdx.local.topology import LocalTopology

    topo = LocalTopology(read_document(args.file), state_dir=args.state, router_port=args.router_port)
    print(f"pdx local: starting {topo.target.name} (logs in {topo.state_dir / 'logs'})", file=sys.stderr)
    with topo:
        for name, secs in topo.healthy_after.items():
            print(f"  {name:<24} healthy after {secs:5.1f}s", file=sys.stderr)
        print(f"pdx local: router at {topo.router_url}  (Ctrl-C stops)", file=sys.stderr)
        stop = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # delivered to sigwait, not a handler
        signal.sigwait(stop)
    return 0


def _down(args: argparse.Namespace) -> int:
    from pdx.local.topology import LocalTopology, stop_recorded

    state = args.state or LocalTopology(read_document(args.file)).state_dir
    stopped = stop_recorded(Path(state))
    print(f"pdx local: stopped {', '.join(stopped) or 'nothing'}", file=sys.stderr)
    return 0


def _plan(args: argparse.Namespace) -> int:
    from pdx.local.topology import LocalTopology

    topo = LocalTopology(read_document(args.file), state_dir=args.state)
    for proc in topo.plan():
        print(f"# {proc.name} ({proc.role}) -> {proc.url}{proc.health_path}")
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(proc.env.items()))
        print(f"{env} {shlex.join(proc.argv)}\n")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("local", help="run a DisaggregatedInference as local processes (vLLM CPU)")
    verbs = p.add_subparsers(dest="verb", required=True)
    for verb, fn, help_ in (
        ("up", _up, "start prefill, decode and router; Ctrl-C stops them"),
        ("down", _down, "stop what a previous `up` started"),
        ("plan", _plan, "print the processes `up` would start"),
    ):
        v = verbs.add_parser(verb, help=help_)
        v.add_argument("-f", "--file", help="CR YAML (default: the embedded examples/local-cpu.yaml)")
        v.add_argument("--state", type=Path, help="state directory (default: ~/.cache/pdx/local/NAME)")
        if verb == "up":
            v.add_argument("--router-port", type=int, default=8000, help="router port if free (default 8000)")
        v.set_defaults(run=fn)
