"""`pdx bench`: the multi-turn agent benchmark, OFF vs ON, locally, in a cluster, or at a URL."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from pdx.resource import SpecError, load, manifest_documents

from . import agentic, decodelocal, firstturn, pool, prefixcache, tails
from .background import BackgroundSpec, write_streams
from .breakdown import (
    BREAKDOWN_HEADERS,
    ENGINE_HEADERS,
    breakdown_rows,
    breakdowns,
    engine_rows,
    engines_json,
)
from .held import claims_line
from .points import HEADERS as POINT_HEADERS
from .points import markdown_table as points_table
from .points import point_stats
from .points import table_rows as point_rows
from .points import to_json as point_json
from .records import stored, write_records
from .report import format_table, markdown, plain, write_report
from .sweep import (
    BOUND,
    FLIP_LEGS,
    ClusterTarget,
    Endpoints,
    Leg,
    LegArg,
    LegResult,
    LocalTarget,
    SweepConfig,
    Target,
    UrlTarget,
    all_records,
    as_leg,
    run_sweep,
    served_model_name,
    total_requests,
    with_changes,
)
from .workload import HFTokenizerCounter, SuffixMix, TokenCounter, WordCounter, WorkloadSpec

DEFAULT_FILE = "examples/local-cpu.yaml"


REUSE_HEADERS_OFF = (
    "the router sent no X-PDX-* headers, so hit rates and prefill times are blank: set "
    "spec.router.reuseHeaders: true on the resource for the benchmark (and back after)"
)


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError("expected one or more non-negative integers")
    return values


def _legs(text: str) -> list[bool | None]:
    table: dict[str, bool | None] = {"off": False, "on": True, "run": None}
    try:
        return [table[v.strip()] for v in text.split(",") if v.strip()]
    except KeyError:
        raise argparse.ArgumentTypeError("legs are off, on (comma-separated)") from None


def _named_leg(text: str) -> Leg:
    """NAME:FIELD=VALUE[,FIELD=VALUE...]: a leg of its own name with spec fields set (values as YAML reads them)."""
    name, _, fields = text.partition(":")
    if not re.fullmatch(r"[a-z][a-z0-9_-]*", name) or name in (*FLIP_LEGS, BOUND):
        raise argparse.ArgumentTypeError(
            f"a leg's name is lowercase letters, digits, - and _, not off, on, run or bound: {name!r}"
        )
    return Leg(name, _changes(fields))


def _changes(fields: str) -> tuple[tuple[str, Any], ...]:
    """FIELD=VALUE[,FIELD=VALUE...]: dotted camelCase paths under spec, values as YAML reads them."""
    changes: list[tuple[str, Any]] = []
    for change in filter(None, (c.strip() for c in fields.split(","))):
        path, eq, value = change.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*", path):
            raise argparse.ArgumentTypeError(f"expected FIELD=VALUE (a dotted path under spec), got {change!r}")
        changes.append((path, yaml.safe_load(value)))
    return tuple(changes)


def _engine_url(text: str) -> tuple[str, str]:
    role, _, url = text.partition("=")
    if role not in ("prefill", "decode") or not url:
        raise argparse.ArgumentTypeError("expected prefill=URL or decode=URL")
    return role, url


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="multi-turn agent benchmark: TTFT by prompt length, bidirectional KV transfer off vs on",
        description=__doc__,
    )
    p.add_argument(
        "-f", "--file", help=f"DisaggregatedInference YAML (--local default: {DEFAULT_FILE} or pdx's embedded copy)"
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--local", action="store_true", help="run the CR as local processes, off then on (default)")
    mode.add_argument(
        "--cluster", action="store_true", help="flip the DisaggregatedInference in a cluster, off then on"
    )
    mode.add_argument("--url", help="benchmark a running router once (no flipping)")
    p.add_argument("--namespace", help="cluster: namespace of the DisaggregatedInference")
    p.add_argument("--name", help="cluster: its name (default: metadata.name of -f)")
    p.add_argument("--router-url", help="cluster: use this router URL instead of status.routerAddress")
    p.add_argument("--engine-url", action="append", type=_engine_url, default=[], metavar="ROLE=URL",
                   help="--url: engines to scrape for NIXL metrics (repeatable)")  # fmt: skip
    p.add_argument("--tokenizer", type=Path, help="tokenizer.json (or its directory) for exact token sizing")
    p.add_argument("--model", help="served model name (default: from the CR, else the router's /v1/models)")
    p.add_argument(
        "--lengths", type=_ints, default=[1000, 2000, 4000], help="prefix lengths in tokens (default 1000,2000,4000)"
    )
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--conversations", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--user-tokens", type=int, default=64, help="tokens of each user instruction")
    p.add_argument("--tool-tokens", type=int, default=192, help="tokens of each tool result (turns >= 2)")
    p.add_argument("--output-tokens", type=int, default=32, help="max_tokens (and min_tokens) of each answer")
    p.add_argument("--no-fixed-output", action="store_true", help="do not send min_tokens")
    p.add_argument("--request-rate", type=float, default=0.0, help="requests/s, Poisson (0: back to back)")
    p.add_argument("--think-time", type=float, default=0.0, help="seconds between turns of a conversation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--legs", type=_legs, default=None, help="off,on (default); --url runs one leg")
    p.add_argument(
        "--leg",
        dest="named_legs",
        action="append",
        type=_named_leg,
        default=[],
        metavar="NAME:FIELD=VALUE[,...]",
        help="a leg of this name on the resource with spec fields set, e.g. "
        "local:router.decodeLocalMaxTokens=8192 (repeatable, in order, after any --legs; no bound)",
    )
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        type=_changes,
        default=[],
        metavar="FIELD=VALUE[,...]",
        help="local: spec fields set on the resource before any leg, e.g. prefill.replicas=2 (repeatable)",
    )
    p.add_argument(
        "--fresh-engines",
        action="store_true",
        help="local: restart the engines every leg, also when only router fields change",
    )
    p.add_argument(
        "--suffix-tokens",
        type=_ints,
        default=[],
        help="follow-up turns' new tokens, a point each at every length (the instruction, at most "
        "--user-tokens, after a tool result of the rest); default: --user-tokens + --tool-tokens",
    )
    p.add_argument(
        "--suffix-mix",
        metavar="agentic|LO-HI:W,...",
        help="each follow-up turn's new tokens drawn from a distribution (seeded; the same for OFF, ON and the "
        "bound): `agentic` (100-512 55%%, 512-1024 20%%, 1024-4096 15%%, 4096-8192 10%%) or buckets LO-HI:WEIGHT, "
        "log-uniform within each; the report gives outcomes and ON/bound per bucket (not with --suffix-tokens)",
    )
    p.add_argument(
        "--live",
        type=_ints,
        default=[],
        metavar="N,N,...",
        help="conversations live at once: a point each (at every length), N conversations on N clients whose "
        "starts spread over one --think-time, so their turns interleave (instead of --conversations/--concurrency)",
    )
    p.add_argument(
        "--unique-prefix",
        action="store_true",
        help="each conversation its own system prompt of --lengths tokens (default: one shared by all)",
    )
    p.add_argument("--no-warmup", action="store_true", help="skip the short warmup conversation per leg")
    p.add_argument(
        "--no-bound",
        action="store_true",
        help="skip the bound: in the ON leg, each length's workload once more, whole turns straight to decode",
    )
    p.add_argument(
        "--no-conversation-id",
        action="store_true",
        help="send no conversation id, as OpenAI clients do: the router finds each conversation by its history"
        " (router.conversationFrom history or both)",
    )
    p.add_argument(
        "--background-streams",
        type=int,
        default=0,
        metavar="N",
        help="N single-turn streams decoding through the router all leg long, restarted as they end; "
        "their TPOT during each point's follow-up turns goes in the per-point table",
    )
    p.add_argument("--background-prompt-tokens", type=int, default=128, help="each stream request's prompt")
    p.add_argument(
        "--background-output-tokens", type=int, default=512, help="each stream request's answer (max and min tokens)"
    )
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="output directory")
    p.add_argument("--state-dir", type=Path, help="local: state directory of the topology")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    p.add_argument(
        "--prometheus",
        metavar="URL",
        help="also read each leg's figures and draw the dashboard's panels from this Prometheus; "
        "`local` (with the local target) starts Debian's prometheus on loopback to scrape each leg",
    )
    p.add_argument("--rollout-timeout", type=float, default=1800.0, help="cluster: seconds to wait for a rollout")
    p.add_argument("--in-cluster", action="store_true", help="print a Job (and its RBAC) that runs this in the cluster")
    p.add_argument("--image", help="--in-cluster: image with pdx installed")
    p.add_argument("--results-claim", help="--in-cluster: PersistentVolumeClaim to keep results in")
    p.set_defaults(run=main)
    reports = p.add_subparsers(
        title="reports on a finished run", metavar="{report-decode-local,report-prefix-cache,wave,wave-report,pool}"
    )
    r = reports.add_parser(
        "report-decode-local",
        help="decode-local against D->P per history length and suffix, and the default threshold they support",
        description=decodelocal.__doc__,
    )
    r.add_argument("run_dir", type=Path, metavar="DIR", help="a run's --out: its records-*.json and background-*.json")
    r.add_argument("--dp-leg", default="dp", help="the leg with decodeLocalMaxTokens 0 (default dp)")
    r.add_argument("--local-leg", default="local", help="the leg that prefills on decode (default local)")
    r.add_argument(
        "--ttft-target", type=float, default=decodelocal.TTFT_TARGET, help="local/D->P TTFT p50, at most (0.7)"
    )
    r.add_argument(
        "--tpot-target", type=float, default=decodelocal.TPOT_TARGET, help="TPOT p90 rise, at most (0.10: 10%%)"
    )
    r.set_defaults(run=report_decode_local)
    r = reports.add_parser(
        "report-prefix-cache",
        help="the live sweep's legs (off, cache, on, on-cache) side by side over runs (topologies)",
        description=prefixcache.__doc__,
    )
    r.add_argument("run_dirs", type=Path, nargs="+", metavar="DIR", help="runs' --out, each with its summary.json")
    r.add_argument("--out", type=Path, required=True, help="where prefix-cache.md, .json and the plot go")
    r.set_defaults(run=report_prefix_cache)
    from . import wave

    r = reports.add_parser(
        "wave",
        help="every figure of the GPU wave in one run on as few engine starts as they allow (scripts/gpu-wave.sh)",
        description=wave.__doc__,
    )
    r.add_argument("out", type=Path, metavar="OUT", help="where each part's results and .tgz go")
    r.add_argument("-f", "--file", type=Path, required=True, help="the DisaggregatedInference to run")
    r.add_argument(
        "--profile", choices=("gpu", "cpu"), default="gpu", help="the parts' sizes (cpu: tiny, to try the flow)"
    )
    r.add_argument(
        "--parts",
        help=f"a subset, in the plan's order ({','.join((*wave.PART_NAMES, wave.CORRECT))}; "
        f"only when named: {','.join(wave.OPTIONAL_PARTS)})",
    )
    r.add_argument(
        "--budget-s", type=float, help=f"seconds for the wave and correct (default {wave.MACHINE_S - wave.OUTSIDE_S})"
    )
    r.add_argument(
        "--decode-blocks",
        type=int,
        default=796,
        help="decode's KV blocks (--num-gpu-blocks-override; 796 x 128 tokens: the H100's 101,888), so an H200 or "
        "a GPU of its own meets the same pressure; 0: the engine's own",
    )
    r.add_argument("--plan", action="store_true", help="print the plan (parts, legs, estimates) and exit: 0 if it fits")
    r.add_argument("--state-dir", type=Path, help="the topology's state directory")
    r.set_defaults(run=run_wave)
    r = reports.add_parser("wave-report", help="OUT/report.md over a wave's parts, the sweep beside the seed's p5en")
    r.add_argument("out", type=Path, metavar="OUT")
    r.set_defaults(run=wave_report)
    r = reports.add_parser(
        "pool",
        help="repeated runs' turns pooled per point and leg, each leg's percentiles over the base leg's",
        description=pool.__doc__,
    )
    r.add_argument("run_dirs", type=Path, nargs="+", metavar="DIR", help="runs' --out (or a wave part's folder)")
    r.add_argument("--base", default="off", help="the leg the others are compared with (default off)")
    r.add_argument(
        "--same", action="append", default=[], metavar="LEG=AS", help="count LEG's turns as AS's (e.g. on-b=on)"
    )
    r.add_argument("--first", action="store_true", help="first turns instead of follow-ups")
    r.add_argument("--json", type=Path, help="also write the pooled figures here")
    r.set_defaults(run=pool_report)


def report_prefix_cache(args: argparse.Namespace) -> int:
    """`pdx bench report-prefix-cache DIR... --out OUT`."""
    missing = [str(d) for d in args.run_dirs if not (d / "summary.json").is_file()]
    if missing:
        print(f"pdx bench: no summary.json in {', '.join(missing)}", file=sys.stderr)
        return 2
    runs = [prefixcache.read_run(d) for d in args.run_dirs]
    if not any(run.points for run in runs):
        print("pdx bench: no run has points of a live sweep (--live)", file=sys.stderr)
        return 2
    for line in prefixcache.findings(runs):
        print(line)
    for key, path in prefixcache.write_report(runs, args.out).items():
        print(f"{key}: {path}")
    return 0


def run_wave(args: argparse.Namespace) -> int:
    """`pdx bench wave OUT -f CR`: the plan, or the run (pdx_bench.wave)."""
    from pdx.local.topology import cache_root

    from . import wave

    try:
        parts = [p.strip() for p in args.parts.split(",") if p.strip()] if args.parts else None
        plan = wave.plan(args.profile, parts, args.budget_s)
    except ValueError as err:
        print(f"pdx bench wave: {err}", file=sys.stderr)
        return 2
    fits = plan.estimate_s() <= plan.budget_s
    if args.plan:
        print(json.dumps(plan.to_json(), indent=2))
        if not fits:
            print(f"pdx bench wave: the plan needs {plan.estimate_s():.0f} s of {plan.budget_s:.0f}", file=sys.stderr)
        return 0 if fits else 1
    doc = wave.wave_document(_document(argparse.Namespace(file=args.file, local=True, cluster=False, url=None)) or {},
                             args.decode_blocks or None)  # fmt: skip
    limit = int(doc.get("spec", {}).get("model", {}).get("maxModelLen") or 0)
    for part in plan.parts:
        need = max_prompt_tokens(part.spec, list(part.lengths), list(part.suffixes))
        if limit and need > limit:
            print(f"pdx bench wave: {part.name} needs about {need} tokens, over maxModelLen {limit}", file=sys.stderr)
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "plan.txt").write_text(
        f"plan: {plan.profile}, {len(plan.parts)} parts, {plan.starts()} engine starts, about "
        f"{plan.estimate_s():.0f} s of {plan.budget_s:.0f} (correct's {plan.reserve_s:.0f} s included); "
        f"resource {args.file}, decode KV blocks {args.decode_blocks or 'its own'}\n"
    )
    (args.out / "wave-cr.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    name = doc.get("metadata", {}).get("name", "local")
    state = args.state_dir or cache_root() / "local" / name
    counter = _counter_for(argparse.Namespace(tokenizer=None))
    return wave.run(plan, doc, args.out, counter, state_dir=args.state_dir, log_dirs=lambda: iter([state / "logs"]))


def pool_report(args: argparse.Namespace) -> int:
    """`pdx bench pool DIR...`: the pooled table on stdout (pdx_bench.pool)."""
    try:
        same = pool.parse_same(args.same)
        runs = [pool.read_run(d, same, args.first) for d in args.run_dirs]
    except (ValueError, OSError) as err:
        print(f"pdx bench pool: {err}", file=sys.stderr)
        return 2
    pooled = pool.pool(runs)
    if not pooled:
        turns = "first turns" if args.first else "follow-up turns"
        print(f"pdx bench pool: no answered {turns} in {len(runs)} runs", file=sys.stderr)
        return 2
    if not any(p.leg == args.base for p in pooled):
        legs = sorted({p.leg for p in pooled})
        print(f"pdx bench pool: no leg {args.base!r} (--base); legs: {legs}", file=sys.stderr)
        return 2
    print(pool.markdown_table(pooled, args.base))
    if args.json is not None:
        args.json.write_text(json.dumps(pool.to_json(pooled, args.base), indent=2) + "\n")
    return 0


def wave_report(args: argparse.Namespace) -> int:
    from . import wavereport

    if not args.out.is_dir():
        print(f"pdx bench wave-report: no {args.out}", file=sys.stderr)
        return 2
    print(f"report: {wavereport.write(args.out)}")
    return 0


def report_decode_local(args: argparse.Namespace) -> int:
    """`pdx bench report-decode-local DIR`: decode-local.md and .json beside the run's records."""
    missing = [f"records-{leg}.json" for leg in (args.dp_leg, args.local_leg)]
    missing = [name for name in missing if stored(args.run_dir / name) is None]
    if missing:
        print(f"pdx bench: {args.run_dir} holds no {' or '.join(missing)}", file=sys.stderr)
        return 2
    targets = decodelocal.Targets(args.ttft_target, args.tpot_target)
    choice, files = decodelocal.write_report(args.run_dir, args.dp_leg, args.local_leg, targets)
    for line in choice.why:
        print(line)
    for key, path in files.items():
        print(f"{key}: {path}")
    return 0


def _background(args: argparse.Namespace) -> BackgroundSpec | None:
    if not args.background_streams:
        return None
    return BackgroundSpec(args.background_streams, args.background_prompt_tokens, args.background_output_tokens)


def _spec(args: argparse.Namespace) -> WorkloadSpec:
    return WorkloadSpec(
        prefix_tokens=args.lengths[0],
        turns=args.turns,
        conversations=args.conversations,
        user_tokens=args.user_tokens,
        tool_tokens=args.tool_tokens,
        output_tokens=args.output_tokens,
        concurrency=args.concurrency,
        request_rate=args.request_rate,
        think_time_s=args.think_time,
        seed=args.seed,
        fixed_output=not args.no_fixed_output,
        shared_prefix=not args.unique_prefix,
        suffix_mix=SuffixMix.parse(args.suffix_mix) if args.suffix_mix else None,
    )


def _document(args: argparse.Namespace) -> dict[str, Any] | None:
    path = args.file
    if path is None and (args.local or not (args.cluster or args.url)):
        if Path(DEFAULT_FILE).exists():
            path = DEFAULT_FILE
        else:
            from pdx.local import default_document

            return default_document()
    if path is None:
        return None
    try:
        docs = manifest_documents(Path(path).read_text())  # as kubectl reads it: no duplicate keys
    except yaml.YAMLError as err:
        raise SystemExit(f"pdx bench: {path}: not valid YAML: {err}") from None
    doc = docs[0] if len(docs) == 1 else None
    if not isinstance(doc, dict):
        raise SystemExit(f"pdx bench: {path}: not a DisaggregatedInference document")
    return doc


def _bench_args(args: argparse.Namespace) -> list[str]:
    """The workload flags of this invocation, for the in-cluster Job to run the same sweep."""
    out = [
        "--lengths", ",".join(map(str, args.lengths)),
        "--turns", str(args.turns),
        "--conversations", str(args.conversations),
        "--concurrency", str(args.concurrency),
        "--user-tokens", str(args.user_tokens),
        "--tool-tokens", str(args.tool_tokens),
        "--output-tokens", str(args.output_tokens),
        "--request-rate", str(args.request_rate),
        "--think-time", str(args.think_time),
        "--seed", str(args.seed),
        "--timeout", str(args.timeout),
        "--rollout-timeout", str(args.rollout_timeout),
    ]  # fmt: skip
    if args.legs:
        names = {False: "off", True: "on", None: "run"}
        out += ["--legs", ",".join(names[v] for v in args.legs)]
    for leg in args.named_legs:
        fields = ",".join(f"{path}={json.dumps(value)}" for path, value in leg.changes)
        out += ["--leg", f"{leg.name}:{fields}"]
    if args.suffix_tokens:
        out += ["--suffix-tokens", ",".join(map(str, args.suffix_tokens))]
    if args.suffix_mix:
        out += ["--suffix-mix", args.suffix_mix]
    if args.live:
        out += ["--live", ",".join(map(str, args.live))]
    if args.background_streams:
        out += [
            "--background-streams", str(args.background_streams),
            "--background-prompt-tokens", str(args.background_prompt_tokens),
            "--background-output-tokens", str(args.background_output_tokens),
        ]  # fmt: skip
    for flag, value in (("--model", args.model), ("--router-url", args.router_url), ("--prometheus", args.prometheus)):
        if value:
            out += [flag, value]
    for flag, on in (
        ("--no-fixed-output", args.no_fixed_output),
        ("--no-warmup", args.no_warmup),
        ("--no-bound", args.no_bound),
        ("--no-conversation-id", args.no_conversation_id),
        ("--unique-prefix", args.unique_prefix),
    ):
        if on:
            out.append(flag)
    return out


BREAKDOWN_NOTE = (
    "A row per path the turns took: `prefill` (through prefill: a D->P read, a recompute) and `local` "
    "(prefilled on the decode that holds the conversation: no prefill hop), every figure of a row over that "
    "row's turns; where the engines were scraped only around the group, a role whose window mixes both paths "
    "is left blank. "
    "TTFT is the client's, through the router; router is its X-PDX-Router-Ms (its own time before the "
    "first hop: planning, the claim gate, the claim), prefill hop its X-PDX-Prefill-Ms (D->P read "
    "included) and decode hop is TTFT - router - prefill hop. P/D engine TTFT, queue and prefill are the engines' own "
    "vLLM histograms (from arrival in the engine, after the API server tokenized the prompt); queue contains "
    "the NIXL read a request waited for. xfer/post: NIXL transfers the engine initiated, mean per transfer. "
    "API+HTTP = hop - that engine's TTFT. bound: the same turns (other texts, same sizes) sent whole straight "
    "to the first decode engine, which serves them from its prefix cache. `-`: not measured or not exported."
)
ENGINES_NOTE = (
    "Differences of each engine's /metrics across the group (scope `all turns`) or summed around each "
    "follow-up turn (`turns >= 2`, with one client). `-`: the role was not scraped or does not export it."
)


def _in_cluster(args: argparse.Namespace, doc: dict[str, Any] | None) -> int:
    from .job import DEFAULT_IMAGE, job_objects

    meta = (doc or {}).get("metadata", {})
    ns = args.namespace or meta.get("namespace") or "default"
    name = args.name or meta.get("name")
    if not name:
        print("pdx bench: --in-cluster needs --name (or -f with metadata.name)", file=sys.stderr)
        return 2
    objs = job_objects(ns, name, _bench_args(args), image=args.image or DEFAULT_IMAGE, results_claim=args.results_claim)
    sys.stdout.write(yaml.safe_dump_all(objs, sort_keys=False))
    return 0


def _cluster_target(args: argparse.Namespace, doc: dict[str, Any] | None) -> ClusterTarget:
    from kubernetes import client, config

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    meta = (doc or {}).get("metadata", {})
    ns = args.namespace or meta.get("namespace") or "default"
    name = args.name or meta.get("name")
    if not name:
        raise SystemExit("pdx bench: --cluster needs --name (or -f with metadata.name)")
    return ClusterTarget(
        client.CustomObjectsApi(),
        ns,
        name,
        core=client.CoreV1Api(),
        router_url=args.router_url,
        timeout_s=args.rollout_timeout,
    )


def _counter_for(args: argparse.Namespace) -> Any:
    def pick(ep: Endpoints) -> TokenCounter:
        path = args.tokenizer or ep.model_dir
        if path is not None and (Path(path).is_file() or (Path(path) / "tokenizer.json").is_file()):
            return HFTokenizerCounter.from_file(Path(path))
        return WordCounter()

    return pick


def main(args: argparse.Namespace) -> int:
    doc = _document(args)
    if args.in_cluster:
        return _in_cluster(args, doc)
    try:
        spec = _spec(args)
        _background(args)
    except ValueError as err:
        print(f"pdx bench: {err}", file=sys.stderr)
        return 2
    if args.suffix_mix and args.suffix_tokens:
        print("pdx bench: --suffix-mix draws each turn's suffix; give it or --suffix-tokens, not both", file=sys.stderr)
        return 2
    if args.sets and (args.url or args.cluster):
        print("pdx bench: --set edits the local resource; in a cluster, edit it there", file=sys.stderr)
        return 2
    target: Target
    if args.url:
        engines: dict[str, list[str]] = {}
        for role, url in args.engine_url:
            engines.setdefault(role, []).append(url)
        target = UrlTarget(args.url, engines)
        legs: list[LegArg] = [*(args.legs or []), *args.named_legs] or [None]
    elif args.cluster:
        target = _cluster_target(args, doc)
        legs = [*(args.legs or []), *args.named_legs] or [False, True]
    else:
        assert doc is not None
        doc = with_changes(doc, [change for changes in args.sets for change in changes])
        target = LocalTarget(doc, args.state_dir, fresh_engines=args.fresh_engines)
        legs = [*(args.legs or []), *args.named_legs] or [False, True]
        check_legs(doc, legs)
        limit = doc.get("spec", {}).get("model", {}).get("maxModelLen")
        need = max_prompt_tokens(spec, args.lengths, args.suffix_tokens)
        if limit and need > int(limit):
            print(f"pdx bench: the last turn needs about {need} tokens, over maxModelLen {limit}", file=sys.stderr)
            return 2
        if args.prometheus == "local":
            return _with_local_prometheus(args, doc, target, spec, legs)
    if args.prometheus == "local":
        print("pdx bench: --prometheus local scrapes the local target only; give a URL otherwise", file=sys.stderr)
        return 2
    return _run(args, doc, target, spec, legs)


def check_legs(doc: dict[str, Any], legs: list[LegArg]) -> None:
    """Every leg's resource, validated before the first leg runs: a value YAML reads as another
    type (`PDX_X=yes` is a boolean) would otherwise end the run at that leg, the legs before it lost.
    Raises SpecError naming the leg."""
    for leg in legs:
        changed = as_leg(leg)
        try:
            load(with_changes(doc, changed.changes))
        except SpecError as err:
            hint = " (--leg values are read as YAML: quote a string, e.g. FIELD='yes')"
            raise SpecError([f"--leg {changed.name}: {problem}{hint}" for problem in err.problems]) from None


def max_prompt_tokens(spec: WorkloadSpec, lengths: list[int], suffixes: list[int]) -> int:
    """About the longest prompt a sweep sends (its last turns), to check against maxModelLen; a
    suffix mix's draws differ per length, so every length is checked."""
    if spec.suffix_mix is not None:
        return max(spec.with_prefix(n).last_turn_tokens() for n in lengths)
    longest = spec.with_prefix(max(lengths))
    return max(s.last_turn_tokens() for s in [longest.with_new_tokens(n) for n in suffixes] or [longest])


def _with_local_prometheus(
    args: argparse.Namespace, doc: dict[str, Any], target: LocalTarget, spec: WorkloadSpec, legs: list[LegArg]
) -> int:
    from .localprom import PrometheusMissing, local_prometheus, scrape_targets

    instance = doc.get("metadata", {}).get("name", "local")
    try:
        with local_prometheus() as prom:
            target.on_ready = lambda ep: prom.scrape(scrape_targets(ep.router_url, ep.engine_urls, instance))
            target.on_leg_end = prom.settle  # the leg's last counts scraped before its pods stop
            args.prometheus = prom.url
            return _run(args, doc, target, spec, legs)
    except PrometheusMissing as err:
        print(f"pdx bench: --prometheus local: {err}", file=sys.stderr)
        return 2


def _run(
    args: argparse.Namespace, doc: dict[str, Any] | None, target: Target, spec: WorkloadSpec, legs: list[LegArg]
) -> int:
    if args.model is None and doc is not None:
        args.model = served_model_name(doc)
    cfg = SweepConfig(
        lengths=args.lengths,
        spec=spec,
        legs=legs,
        warmup=not args.no_warmup,
        timeout_s=args.timeout,
        model=args.model,
        bound=not args.no_bound,
        conversation_id=not args.no_conversation_id,
        suffixes=args.suffix_tokens,
        background=_background(args),
        live=args.live,
    )
    instance = (args.name or (doc or {}).get("metadata", {}).get("name")) if args.cluster else None
    topology = topology_name(doc) if doc is not None and not args.url else None
    return execute(
        target, cfg, args.out, _counter_for(args), prometheus=args.prometheus, instance=instance, topology=topology
    )


def topology_name(doc: dict[str, Any]) -> str:
    """`xPyD` from the resource's replicas (1 each when unset, the models' default)."""
    spec = doc.get("spec", {})
    prefill = spec.get("prefill", {}).get("replicas", 1)
    decode = spec.get("decode", {}).get("replicas", 1)
    return f"{prefill}P{decode}D"


def capacity_text(capacity: dict[str, list[int | None]]) -> str:
    """e.g. `prefill 4096, 4096; decode 524288` (tokens per engine; `?`: not said)."""
    return "; ".join(
        f"{role} " + ", ".join("?" if n is None else str(n) for n in per) for role, per in capacity.items() if per
    )


def execute(
    target: Target,
    cfg: SweepConfig,
    out: Path,
    counter_for: Any,
    prometheus: str | None = None,
    instance: str | None = None,
    topology: str | None = None,
) -> int:
    """Run the sweep with a progress bar, write records, plots and report, print the table."""
    from tqdm import tqdm

    started = time.time()
    bar = tqdm(total=total_requests(cfg), unit="req", file=sys.stderr, dynamic_ncols=True)

    def progress(rec: Any) -> None:
        bar.update(1)
        if rec is not None:
            bar.set_postfix(prefix=rec.prefix_tokens, ttft=f"{rec.ttft_ms:.0f}ms", reuse=rec.reuse or "-")

    leg_started: dict[str, float] = {}

    def leg_start(leg: str) -> None:
        leg_started[leg] = time.time()
        bar.set_description(f"leg {leg}")
        bar.refresh()

    try:
        results = run_sweep(target, cfg, counter_for, progress, leg_start)
    finally:
        bar.close()
    return write_outputs(
        results, target, cfg, out, started, leg_started, prometheus=prometheus, instance=instance, topology=topology
    )


def write_outputs(
    results: list[LegResult],
    target: Any,
    cfg: SweepConfig,
    out: Path,
    started: float,
    leg_started: dict[str, float] | None = None,
    prometheus: str | None = None,
    instance: str | None = None,
    topology: str | None = None,
    extra_context: dict[str, str] | None = None,
) -> int:
    """Records, plots, report.md and summary.json of a sweep's legs, the tables printed; the exit
    code (1: a request failed or none succeeded). `target`: what served them (its description, and
    where it has them, each leg's start time, router-only legs, peak memory)."""
    leg_started = leg_started or {}
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    errors: list[dict[str, Any]] = []
    for leg in results:
        files[f"records_{leg.leg}"] = write_records(out / f"records-{leg.leg}.json", leg.records)
        if leg.background:
            files[f"background_{leg.leg}"] = write_streams(out / f"background-{leg.leg}.json", leg.background)
        errors += leg.errors
    if errors:
        files["errors"] = out / "errors.json"
        files["errors"].write_text(json.dumps(errors, indent=2) + "\n")
    records = all_records(results)
    context = {
        "target": target.description,
        **({"topology": topology} if topology else {}),
        "lengths": ",".join(map(str, cfg.lengths)),
        "workload": (
            ("live conversations" if cfg.live else f"{cfg.spec.conversations} conversations")
            + f" x {cfg.spec.turns} turns, "
            + (
                f"user at most {cfg.spec.user_tokens} + tool the rest of each suffix, "
                if cfg.suffixes or cfg.spec.suffix_mix is not None
                else f"user {cfg.spec.user_tokens} + tool {cfg.spec.tool_tokens} tokens/turn, "
            )
            + f"{cfg.spec.output_tokens} output tokens, "
            + (f"concurrency {cfg.spec.concurrency}, " if not cfg.live else "one client each, ")
            + f"seed {cfg.spec.seed}"
        ),
        "wall time": f"{time.time() - started:.0f} s",
    }
    if cfg.suffixes:
        context["suffixes"] = ",".join(map(str, cfg.suffixes)) + " new tokens per follow-up turn"
    if cfg.spec.suffix_mix is not None:
        context["suffix mix"] = cfg.spec.suffix_mix.describe()
    context.update(extra_context or {})
    if cfg.live:
        context["live conversations"] = (
            ",".join(map(str, cfg.live)) + f" (a point each; think time {cfg.spec.think_time_s:g} s, "
            f"{'its own' if not cfg.spec.shared_prefix else 'one shared'} system prompt per conversation)"
        )
    for leg in results:
        if leg.capacity:
            context[f"{leg.leg} leg KV capacity (tokens)"] = capacity_text(leg.capacity)
    if cfg.background is not None:
        bg = cfg.background
        context["background"] = (
            f"{bg.streams} stream{'s' if bg.streams != 1 else ''} through the router, {bg.prompt_tokens} prompt + "
            f"{bg.output_tokens} output tokens "
            "per request, restarted as they end"
        )
    for leg_name in getattr(target, "router_only", []):
        context[f"{leg_name} leg"] = "the engines of the leg before, the router restarted with its fields"
    for attr in ("start_seconds", "rollout_seconds"):
        for leg_name, secs in getattr(target, attr, {}).items():
            context[f"{leg_name} leg ready after"] = f"{secs:.0f} s"
    if prometheus:
        from .prometheus import context as prometheus_context
        from .prometheus import windows

        legs_at = windows(leg_started, time.time())
        context.update(prometheus_context(prometheus, legs_at, instance))
        try:
            from .panels import draw

            counts = draw(prometheus, legs_at, out / "dashboard.png")
            files["dashboard"] = out / "dashboard.png"
            empty = [title for title, n in counts.items() if not n]
            context["dashboard panels without data"] = ", ".join(empty) or "none"
        except OSError as err:
            context["dashboard panels"] = f"not drawn from {prometheus}: {err}"
    for leg in results:
        if claims := claims_line(leg.router_stats):
            context[f"{leg.leg} leg: the router's claims on held KV"] = claims
    for leg_name, peaks in getattr(target, "peak_rss_mib", {}).items():
        context[f"{leg_name} leg peak RSS"] = ", ".join(f"{name} {mib / 1024:.2f} GiB" for name, mib in peaks.items())
    source = sorted({r.kv_transfer_source for r in records if r.kv_transfer_source})
    notes = [
        "TTFT: time to the first streamed content chunk, as vLLM's multi-turn benchmark measures it.",
        "Prefill time: the router's X-PDX-Prefill-Ms (its prefill hop, the KV read included).",
        "KV transfer: prefill engines' vllm:nixl_xfer_time_seconds (D->P reads), attributed per "
        + ("/".join(source) if source else "- (engine metrics not reachable)")
        + ".",
        "Hit rate: share of follow-up turns whose X-PDX-Reuse was `hit`.",
    ]
    notes += [note for leg in results for note in leg.notes]
    engines = {leg.leg: leg.engines for leg in results}
    where = breakdowns(records, engines)
    sections: list[tuple[str, str]] = []
    if where:
        table = markdown(BREAKDOWN_HEADERS, breakdown_rows(where))
        sections.append(("Where ON's TTFT goes (ms)", f"{table}\n\n{BREAKDOWN_NOTE}"))
    streams = [s for leg in results for s in leg.background]
    point_engines = {(leg.leg, p.length, p.suffix, p.live): g for leg in results for p, g in leg.points.items()}
    point_held = {(leg.leg, p.length, p.suffix, p.live): h for leg in results for p, h in leg.held.items()}
    capacity = {leg.leg: leg.capacity.get("decode", []) for leg in results}
    per_point = point_stats(
        records,
        streams,
        engines=point_engines,
        held_by_point=point_held,
        decode_capacity=capacity,
        shared_prefix=cfg.spec.shared_prefix,
    )
    per_point_shown = bool(
        cfg.suffixes or cfg.live or cfg.background is not None or any(leg.named for leg in cfg.leg_list())
    )
    if per_point_shown:
        sections.insert(0, ("TTFT and background TPOT per leg and point", points_table(per_point)))
        heading = "The slowest follow-ups per leg and point: where their time went (ms)"
        sections.insert(1, (heading, tails.markdown_table(records)))
    mix = cfg.spec.suffix_mix
    buckets = agentic.bucket_rows(records, mix) if mix is not None else []
    if mix is not None:
        heading = "Agentic mix: outcomes and ON/bound per suffix bucket"
        sections.insert(0, (heading, agentic.markdown_table(buckets, mix)))
    firsts = firstturn.first_turns(records, engines)
    if firsts:
        table = markdown(firstturn.HEADERS, firstturn.rows(firsts))
        sections.append(("First turns per leg: where TTFT goes (ms)", f"{table}\n\n{firstturn.NOTE}"))
    per_role = engine_rows(engines)
    if per_role:
        table = markdown(ENGINE_HEADERS, per_role)
        sections.append(
            ("Engine-side figures per role (ms: mean per observation (count))", f"{table}\n\n{ENGINES_NOTE}")
        )
    if records and not any(r.reuse for r in records if r.leg != "bound"):
        # A deployment keeps reuse facts from its clients unless router.reuseHeaders is on.
        notes.append(REUSE_HEADERS_OFF)
        print(f"pdx bench: {REUSE_HEADERS_OFF}", file=sys.stderr)
    legs = cfg.leg_list()
    off_on = any(not leg.named for leg in legs)
    title = "pdx bench: " + (
        "bidirectional KV transfer OFF vs ON" if off_on else "legs " + ", ".join(leg.name for leg in legs)
    )
    rows, written = write_report(
        records, out, title=title, context=context, notes=notes, sections=sections, off_on=off_on
    )
    files.update(written)
    summary = {
        "context": context,
        "rows": [_row_json(r) for r in rows],
        "errors": len(errors),
        "router_stats": {leg.leg: leg.router_stats for leg in results if leg.leg != "bound"},
        "points": [point_json(p, per_point) for p in per_point],
        "capacity": {leg.leg: leg.capacity for leg in results if leg.capacity},
        "ttft_breakdown": [b.to_json() for b in where],
        "first_turns": [t.to_json() for t in firsts],
        **({"agentic": agentic.to_json(buckets, mix)} if mix is not None else {}),
        "engines": engines_json(engines),
        "notes": notes,
    }
    files["summary"] = out / "summary.json"
    files["summary"].write_text(json.dumps(summary, indent=2) + "\n")
    if off_on:
        print("TTFT in ms by prefix length (turns >= 2):")
        print(format_table(rows))
    if per_point_shown:
        print("TTFT and background TPOT in ms per leg and point (turns >= 2):")
        print(plain(POINT_HEADERS, point_rows(per_point)))
    if mix is not None:
        print(f"Agentic mix, TTFT in ms per suffix bucket (turns >= 2; {mix.name}):")
        print(plain(agentic.HEADERS, agentic.table_rows(buckets)))
    if where:
        print("Where ON's TTFT goes (ms; hops and engine figures are means):")
        print(plain(BREAKDOWN_HEADERS, breakdown_rows(where)))
    for note in notes:
        if note.startswith(("bound:", "engine metrics:")):
            print(f"pdx bench: {note}", file=sys.stderr)
    for key, path in files.items():
        print(f"{key}: {path}")
    if errors:
        print(f"pdx bench: {len(errors)} request(s) failed; see {files['errors']}", file=sys.stderr)
        return 1
    if not records:
        print("pdx bench: no request succeeded", file=sys.stderr)
        return 1
    return 0


def _row_json(row: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return {
        "length": row.length,
        "off": asdict(row.off) if row.off else None,
        "on": asdict(row.on) if row.on else None,
        "ratio": row.ratio,
        "bound": asdict(row.bound) if row.bound else None,
        "on_over_bound": None if row.on_over_bound != row.on_over_bound else row.on_over_bound,
    }
