"""`pdx local up|down|plan`: the rendered topology as local processes; `wheelhouse`: its offline install."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

from pdx.local import default_document
from pdx.local import wheelhouse as wh
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


def _wheelhouse(args: argparse.Namespace) -> int:
    def log(line: str) -> None:
        print(line, file=sys.stderr)

    if args.check:
        return _check_parts(args.out)
    try:
        target = wh.Target(torch=args.torch, cuda=args.cuda, python=args.python)
        target.check()
        if args.part_mib is not None and not 1 <= args.part_mib <= 4096:
            raise wh.WheelhouseError(f"--part-mib {args.part_mib}: expected 1..4096 (MiB per part folder)")
        mib = wh.part_mib(args.part_mib, wh.checkout_bytes(Path.cwd()))
        log(f"parts of at most {mib} MiB")
        wh.build(args.out, target, args.cache, mib * wh.MIB, log)
    except wh.WheelhouseError as err:
        print(f"pdx local wheelhouse: {err}", file=sys.stderr)
        return err.exit_code
    print((args.out / "READY").read_text(), end="")
    return 0


def _check_parts(out: Path) -> int:
    """`--check`: do the built parts still fit one transfer each beside this checkout?"""
    checkout = wh.checkout_bytes(Path.cwd())
    if not (out / "READY").is_file():
        print(f"pdx local wheelhouse: {out} holds no built wheelhouse (no READY): build it first", file=sys.stderr)
        return 2
    if checkout is None:
        print(f"pdx local wheelhouse: {out}: outside a git checkout nothing travels beside the parts")
        return 0
    here = f"this checkout ({checkout / wh.MIB:.1f} MiB that travel with every call)"
    big = wh.parts_too_big(out, checkout)
    if big:
        print(
            f"pdx local wheelhouse: {', '.join(big)} no longer fit one {wh.TRANSFER_MIB} MiB transfer beside {here}: "
            f"build the parts again (`pdx local wheelhouse --out {out}`, from the download cache), "
            "or move results out of the tree",
            file=sys.stderr,
        )
        return 2
    print(f"{out}: every part fits one transfer beside {here}")
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
    w = verbs.add_parser(
        "wheelhouse",
        help="download, trim and split the wheels for a GPU machine without network (docs/gpu.md)",
        description="Run on a networked machine; carry the part folders to the GPU machine and install them "
        "there with c1/gpu-install.sh (docs/gpu.md, 'Offline install on an air-gapped GPU machine').",
    )
    w.add_argument("--out", type=Path, required=True, help="folder for the parts c1, c2, ... (empty or a wheelhouse)")
    w.add_argument("--torch", default="2.11.0", help="the GPU image's torch; picks vLLM by its exact pin (2.11.0)")
    w.add_argument("--cuda", type=int, default=13, help="the CUDA major; picks nixl_cu12 or nixl_cu13 (13)")
    w.add_argument("--python", default="3.12", help="the GPU image's Python, MAJOR.MINOR (3.12)")
    w.add_argument(
        "--part-mib",
        type=int,
        default=None,
        help=f"most MiB per part folder, one transfer each beside the checkout (default: what fits beside "
        f"this checkout in {wh.TRANSFER_MIB} MiB, at most {wh.DEFAULT_PART_MIB})",
    )
    w.add_argument(
        "--cache",
        type=Path,
        default=Path.home() / ".cache" / "pdx" / "wheelhouse",
        help="downloaded wheels, reused by the next build (~/.cache/pdx/wheelhouse)",
    )
    w.add_argument(
        "--check",
        action="store_true",
        help="build nothing: exit 2 if a built part no longer fits one transfer beside this checkout",
    )
    w.set_defaults(run=_wheelhouse)
