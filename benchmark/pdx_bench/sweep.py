"""The OFF/ON sweep over prefix lengths, and the places it can run: local, cluster, a URL.

A `Target` turns a leg (OFF, ON, or a named one: spec fields set on the resource) into a
serving endpoint. Local and cluster edit the same resource as a user would: locally the
runtime re-renders and restarts the processes (only the router when only router fields
differ from the leg before), in a cluster the operator rolls what changed and the target
waits for the status to say the new config serves. A URL target serves what runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from .background import BackgroundSpec, BackgroundStreams, StreamRecord
from .client import RunResult, run
from .enginemetrics import EngineScraper, GroupEngines, accumulate, snapshot_delta, xfer_totals
from .held import HeldFigures, read_holds
from .records import RequestRecord, spread_group_transfer
from .workload import TokenCounter, Workload, WorkloadSpec, build

GROUP = "inference.pdx.dev"
VERSION = "v1alpha1"
PLURAL = "disaggregatedinferences"
ENGINE_PORT = 8000


@dataclass(frozen=True)
class Endpoints:
    """Where one leg is served."""

    router_url: str
    engine_urls: dict[str, list[str]] = field(default_factory=dict)
    model_dir: Path | None = None
    served_model_name: str | None = None


@dataclass(frozen=True)
class Leg:
    """One leg of a sweep: its name, and the spec fields it sets on the resource (dotted
    camelCase paths under `spec`, e.g. `router.decodeLocalMaxTokens`); none: as it is."""

    name: str
    changes: tuple[tuple[str, Any], ...] = ()

    @property
    def named(self) -> bool:
        """Given by name (`--leg`), not OFF, ON or the one leg of a URL run."""
        return self.name not in FLIP_LEGS


FLIP_LEGS = ("off", "on", "run")
LegArg = Leg | bool | None  # a leg given by name, or OFF (False), ON (True), as it is (None)


def as_leg(leg: LegArg) -> Leg:
    """OFF (False), ON (True), "as it is" (None), or a leg given by name."""
    if isinstance(leg, Leg):
        return leg
    if leg is None:
        return Leg("run")
    return Leg("on" if leg else "off", (("kvTransfer.bidirectional", leg),))


class Target(Protocol):
    """Serves a leg; `close` ends what a leg left running for the next (local engines)."""

    description: str

    def serve(self, leg: LegArg) -> contextlib.AbstractContextManager[Endpoints]: ...

    def close(self) -> None: ...


def with_changes(document: dict[str, Any], changes: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """A copy of a DisaggregatedInference document with spec fields set (the user's own edit)."""
    doc = copy.deepcopy(document)
    for path, value in changes:
        node = doc.setdefault("spec", {})
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return doc


def set_bidirectional(document: dict[str, Any], value: bool) -> dict[str, Any]:
    """A copy of a DisaggregatedInference document with the switch set (the user's own edit)."""
    return with_changes(document, as_leg(value).changes)


# Router fields that the engines are rendered from too: decode's logits processor.
ROUTER_FIELDS_ENGINES_SEE = ("firstTokenFromPrefill",)


def engines_see(document: dict[str, Any]) -> dict[str, Any]:
    """What of a document the engines see: all of it but `spec.router`, less the router fields
    an engine's arguments follow (ROUTER_FIELDS_ENGINES_SEE)."""
    out = copy.deepcopy(document)
    router = out.get("spec", {}).pop("router", None) or {}
    kept = {k: router[k] for k in ROUTER_FIELDS_ENGINES_SEE if k in router}
    if kept:
        out["spec"]["router"] = kept
    return out


def only_router_differs(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two documents differ in `spec.router` alone: the engines need not restart."""
    return engines_see(a) == engines_see(b)


def served_model_name(document: dict[str, Any]) -> str | None:
    model = document.get("spec", {}).get("model", {})
    name = model.get("servedModelName") or model.get("name")
    return str(name) if name else None


class UrlTarget:
    """A router somebody else runs: one leg, no flipping."""

    def __init__(
        self, url: str, engine_urls: dict[str, list[str]] | None = None, model_dir: Path | None = None
    ) -> None:
        self.url = url
        self.engine_urls = engine_urls or {}
        self.model_dir = model_dir
        self.description = f"router at {url}"

    @contextlib.contextmanager
    def serve(self, leg: LegArg) -> Iterator[Endpoints]:
        if as_leg(leg).changes:
            raise ValueError("a URL target cannot flip the resource's fields; use --local or --cluster for a sweep")
        yield Endpoints(self.url, self.engine_urls, self.model_dir)

    def close(self) -> None:
        pass


TopologyFactory = Callable[[dict[str, Any], Path | None], Any]


def _local_topology(document: dict[str, Any], state_dir: Path | None) -> Any:
    from pdx.local.topology import LocalTopology

    return LocalTopology(document, state_dir)


class LocalTarget:
    """The CR run as local processes by `pdx.local`; each leg re-renders and restarts them.

    A leg whose document differs from the running one in `spec.router` alone restarts only the
    router (`LocalTopology.reconfigure_router`), as the operator would roll only its Deployment:
    an engine start costs a minute or two on a GPU. The engines then keep what the leg before
    left in them (prefix caches, held blocks); `fresh_engines` restarts everything every leg.
    """

    def __init__(
        self,
        document: dict[str, Any],
        state_dir: Path | None = None,
        factory: TopologyFactory | None = None,
        on_ready: Callable[[Endpoints], None] | None = None,
        on_leg_end: Callable[[], None] | None = None,
        fresh_engines: bool = False,
    ) -> None:
        self.document = document
        self.state_dir = state_dir
        self.factory = factory or _local_topology
        self.on_ready = on_ready  # each leg's engines and router, once they serve (e.g. to scrape them)
        self.on_leg_end = on_leg_end  # while they still serve, after the leg's last turn
        self.fresh_engines = fresh_engines
        self.description = f"local topology of {document.get('metadata', {}).get('name', '?')}"
        self.start_seconds: dict[str, float] = {}
        self.router_only: list[str] = []  # legs that restarted the router alone
        self.peak_rss_mib: dict[str, dict[str, float]] = {}
        self._running: tuple[Any, dict[str, Any]] | None = None  # the topology entered, and its document

    def _topology(self, doc: dict[str, Any], leg: str) -> Any:
        if self._running is not None:
            topo, running_doc = self._running
            if not self.fresh_engines and only_router_differs(running_doc, doc):
                if doc != running_doc:
                    topo.reconfigure_router(doc)
                self._running = (topo, doc)
                self.router_only.append(leg)
                return topo
            self.close()
        topo = self.factory(doc, self.state_dir)
        topo.__enter__()
        self._running = (topo, doc)
        return topo

    @contextlib.contextmanager
    def serve(self, leg: LegArg) -> Iterator[Endpoints]:
        leg = as_leg(leg)
        doc = with_changes(self.document, leg.changes)
        t0 = time.monotonic()
        try:
            topo = self._topology(doc, leg.name)
        except BaseException:
            self.close()
            raise
        self.start_seconds[leg.name] = time.monotonic() - t0
        try:
            endpoints = Endpoints(
                router_url=str(topo.router_url),
                engine_urls={k: list(v) for k, v in dict(topo.engine_urls).items()},
                model_dir=Path(topo.model_dir),
                served_model_name=served_model_name(doc),
            )
            if self.on_ready is not None:
                self.on_ready(endpoints)
            yield endpoints
        except BaseException:
            self._leg_end(topo, leg.name)
            self.close()
            raise
        self._leg_end(topo, leg.name)

    def _leg_end(self, topo: Any, leg: str) -> None:
        """Read while the processes still run."""
        if self.on_leg_end is not None:
            self.on_leg_end()
        self.peak_rss_mib[leg] = dict(topo.peak_rss_mib())

    def close(self) -> None:
        """Stop the topology the last leg left running."""
        if self._running is not None:
            topo, _ = self._running
            self._running = None
            topo.__exit__(None, None, None)


class RolloutTimeout(TimeoutError):
    pass


def _ready(obj: dict[str, Any]) -> bool:
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def expected_config_hash(obj: dict[str, Any]) -> str | None:
    """The engine config generation the operator will roll to, computed with its own code."""
    try:
        from pdx.render.meta import config_hash
        from pdx.resource import load

        return config_hash(load(obj))
    except Exception:
        return None


class ClusterTarget:
    """A DisaggregatedInference in a cluster, flipped through the Kubernetes API.

    `api` is a kubernetes CustomObjectsApi (or anything with its get/patch methods), `core`
    a CoreV1Api used to find engine pods for metrics (optional). `router_url` overrides
    status.routerAddress, e.g. for a port-forward from outside the cluster.
    """

    def __init__(
        self,
        api: Any,
        namespace: str,
        name: str,
        *,
        core: Any = None,
        router_url: str | None = None,
        timeout_s: float = 1800.0,
        poll_s: float = 5.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.core = core
        self.namespace = namespace
        self.name = name
        self.router_url = router_url
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self._sleep = sleep
        self._clock = clock
        self.description = f"DisaggregatedInference {namespace}/{name}"
        self.rollout_seconds: dict[str, float] = {}

    def _get(self) -> dict[str, Any]:
        obj: dict[str, Any] = self.api.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name)
        return obj

    def flip(self, bidirectional: bool) -> dict[str, Any]:
        """Patch the switch and wait until the new config serves; returns the object then."""
        return self.apply(as_leg(bidirectional))

    def apply(self, leg: Leg) -> dict[str, Any]:
        """Merge-patch the leg's fields that differ and wait until the new config serves."""
        before = self._get()
        want = with_changes(before, leg.changes)
        changed = want.get("spec") != before.get("spec")
        t0 = self._clock()
        if changed:
            patch = {"spec": with_changes({}, leg.changes)["spec"]}
            self.api.patch_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.name, patch, _content_type="application/merge-patch+json"
            )
        obj = self.wait_rolled_out(previous_hash=before.get("status", {}).get("configHash"), changed=changed)
        self.rollout_seconds[leg.name] = self._clock() - t0
        return obj

    def wait_rolled_out(self, previous_hash: str | None, changed: bool) -> dict[str, Any]:
        deadline = self._clock() + self.timeout_s
        while True:
            obj = self._get()
            if self._rolled_out(obj, previous_hash, changed):
                return obj
            if self._clock() >= deadline:
                status = obj.get("status", {})
                raise RolloutTimeout(
                    f"{self.description} not rolled out after {self.timeout_s:.0f}s: generation "
                    f"{obj.get('metadata', {}).get('generation')} observed {status.get('observedGeneration')}, "
                    f"configHash {status.get('configHash')}, Ready {_ready(obj)}"
                )
            self._sleep(self.poll_s)

    def _rolled_out(self, obj: dict[str, Any], previous_hash: str | None, changed: bool) -> bool:
        status = obj.get("status") or {}
        generation = obj.get("metadata", {}).get("generation")
        if generation is None or status.get("observedGeneration") is None:
            return False
        if int(status["observedGeneration"]) < int(generation):
            return False
        got = status.get("configHash")
        want = expected_config_hash(obj)
        if want is not None and got != want:
            return False
        if want is None and changed and got == previous_hash:
            return False
        return _ready(obj)

    def engine_urls(self, config_hash: str | None) -> dict[str, list[str]]:
        """Ready engine pods of the config in force, addressed by pod IP (in-cluster only)."""
        if self.core is None:
            return {}
        out: dict[str, list[str]] = {}
        for role in ("prefill", "decode"):
            selector = f"app.kubernetes.io/instance={self.name},pdx.dev/role={role}"
            pods = self.core.list_namespaced_pod(self.namespace, label_selector=selector)
            urls = []
            for pod in pods.items:
                labels = pod.metadata.labels or {}
                if config_hash and labels.get("pdx.dev/config-hash") not in (None, config_hash):
                    continue
                if pod.status.pod_ip and pod.status.phase == "Running":
                    urls.append(f"http://{pod.status.pod_ip}:{ENGINE_PORT}")
            out[role] = urls
        return out

    @contextlib.contextmanager
    def serve(self, leg: LegArg) -> Iterator[Endpoints]:
        leg = as_leg(leg)
        obj = self.apply(leg) if leg.changes else self._get()
        status = obj.get("status") or {}
        url = self.router_url or status.get("routerAddress")
        if not url:
            raise RuntimeError(f"{self.description} has no status.routerAddress; pass --router-url")
        yield Endpoints(
            router_url=str(url),
            engine_urls=self.engine_urls(status.get("configHash")),
            served_model_name=served_model_name(obj),
        )

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------------------ sweep


@dataclass(frozen=True)
class Point:
    """One group of a leg: a prefix length, and the suffix and live conversations when swept."""

    length: int
    suffix: int | None = None
    live: int | None = None

    @property
    def label(self) -> str:
        """What a point adds to its conversations' ids."""
        return ("" if self.suffix is None else f"-n{self.suffix}") + ("" if self.live is None else f"-l{self.live}")

    @property
    def salt(self) -> str:
        """What a point adds to its texts' seed: a live point's conversations are other words than
        the point's before (same sizes), whose KV prefill's and decode's caches may still hold."""
        return "" if self.live is None else f":live{self.live}"


@dataclass
class SweepConfig:
    lengths: list[int]
    spec: WorkloadSpec
    legs: Sequence[LegArg] = field(default_factory=lambda: [False, True])
    warmup: bool = True
    timeout_s: float = 300.0
    model: str | None = None  # served model name; else the leg's, else the router's /v1/models
    bound: bool = True  # in the ON leg, each length's workload once more straight to decode
    conversation_id: bool = True  # send each conversation's id; False: the router finds it by its history
    # Follow-up turns' new tokens: each value a point at every length; empty: the spec's own sizes.
    suffixes: list[int] = field(default_factory=list)
    background: BackgroundSpec | None = None  # streams decoding through the router all leg long
    # Conversations live at once: each value a point at every length and suffix, that many
    # conversations each on its own client, interleaved by the think time; empty: the spec's own.
    live: list[int] = field(default_factory=list)
    # Each follow-up turn's new tokens drawn from a distribution (`spec.suffix_mix`); records carry
    # their own draw in suffix_tokens and the mix's name in suffix_mix.

    def __post_init__(self) -> None:
        if self.suffixes and self.spec.suffix_mix is not None:
            raise ValueError("a suffix mix draws each turn's suffix: give it or suffix points, not both")

    def points(self) -> list[Point]:
        """(prefix length, suffix, live conversations) of each group a leg runs, in order."""
        suffixes: list[int | None] = [*self.suffixes] or [None]
        lives: list[int | None] = [*self.live] or [None]
        return [Point(length, suffix, n) for length in self.lengths for suffix in suffixes for n in lives]

    def leg_list(self) -> list[Leg]:
        legs = [as_leg(leg) for leg in self.legs]
        names = [leg.name for leg in legs]
        if len(set(names)) != len(names) or BOUND in names:
            raise ValueError(f"legs need distinct names other than {BOUND!r}: {names}")
        return legs


BOUND = "bound"
BOUND_LEGS = ("on", "run")  # the legs whose topology the bound is measured on (run: --url)
BOUND_SALT = ":bound"  # the bound's texts differ from ON's, sizes equal: decode caches ON's prompts


@dataclass
class LegResult:
    leg: str
    records: list[RequestRecord]
    errors: list[dict[str, Any]]
    router_stats: dict[str, Any] | None = None
    engines: dict[int, GroupEngines] = field(default_factory=dict)  # per prefix length (its suffixes pooled)
    notes: list[str] = field(default_factory=list)
    background: list[StreamRecord] = field(default_factory=list)
    points: dict[Point, GroupEngines] = field(default_factory=dict)  # each point's engine figures
    capacity: dict[str, list[int | None]] = field(default_factory=dict)  # KV tokens per engine, per role
    held: dict[Point, HeldFigures] = field(default_factory=dict)  # decode's held-KV counters' change per point


async def _model_name(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url.rstrip("/") + "/v1/models", timeout=aiohttp.ClientTimeout(total=30)) as resp:
        resp.raise_for_status()
        data = await resp.json()
    return str(data["data"][0]["id"])


async def _router_stats(session: aiohttp.ClientSession, url: str) -> dict[str, Any] | None:
    try:
        async with session.get(url.rstrip("/") + "/v1/pdx/stats", timeout=aiohttp.ClientTimeout(total=10)) as resp:
            if resp.status != 200:
                return None
            data: dict[str, Any] = await resp.json()
            return data
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def _engine_models(session: aiohttp.ClientSession, url: str, timeout_s: float = 10.0) -> list[str] | str:
    """The model ids an engine's OpenAI API serves, or why it did not answer."""
    try:
        async with session.get(url.rstrip("/") + "/v1/models", timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                return f"answered /v1/models with HTTP {resp.status}"
            data = await resp.json(content_type=None)
        return [str(m["id"]) for m in data["data"]]
    except (aiohttp.ClientError, TimeoutError) as err:
        return f"not reachable ({err!r})"
    except (ValueError, KeyError, TypeError) as err:
        return f"answered /v1/models with no model list ({err!r})"


async def _group(
    session: aiohttp.ClientSession,
    scraper: EngineScraper,
    url: str,
    model: str,
    workload: Workload,
    counter: TokenCounter,
    cfg: SweepConfig,
    leg: str,
    progress: Callable[[RequestRecord | None], None] | None,
    bound: bool = False,
) -> tuple[RunResult, GroupEngines]:
    """One (leg, length) group, every engine scraped before and after."""
    before = await scraper.snapshot()
    res = await run(
        session,
        url,
        model,
        workload,
        counter=counter,
        scraper=scraper,
        leg=leg,
        # decode serves a plain request itself; router fields stay out
        send_conversation_id=cfg.conversation_id and not bound,
        transfer_role=None if bound else "prefill",
        on_done=progress,
        timeout_s=cfg.timeout_s,
    )
    engines = GroupEngines(
        all_turns=snapshot_delta(await scraper.snapshot(), before),
        followups=res.followups,
        followups_by_path=dict(res.followups_by_path) if res.followups is not None else None,
        first_turns=res.first_turns,
    )
    prefill = engines.all_turns.get("prefill")
    if prefill is not None and not bound:
        xfer = xfer_totals(prefill)
        spread_group_transfer(res.records, xfer.seconds * 1000, xfer.bytes)
    return res, engines


@dataclass(frozen=True)
class BoundPlan:
    """Where the bound runs (decode's first engine) and under which model name, or why not."""

    url: str | None = None
    model: str | None = None
    note: str | None = None


async def plan_bound(
    session: aiohttp.ClientSession, ep: Endpoints, cfg: SweepConfig, leg: str, model: str
) -> BoundPlan:
    if leg not in BOUND_LEGS:
        return BoundPlan()
    if not cfg.bound:
        return BoundPlan(note="bound: not measured (--no-bound)")
    decode = ep.engine_urls.get("decode") or []
    if not decode:
        return BoundPlan(
            note="bound: not measured, no decode engine URL known (with --url, add --engine-url decode=URL)"
        )
    models = await _engine_models(session, decode[0])
    if isinstance(models, str) or not models:
        return BoundPlan(note=f"bound: not measured, decode engine {decode[0]} {models or 'serves no model'}")
    if model in models:
        return BoundPlan(url=decode[0], model=model)
    return BoundPlan(
        url=decode[0], model=models[0], note=f"bound: decode serves {models[0]!r}, not {model!r}; sent that"
    )


def _pooled(a: GroupEngines | None, b: GroupEngines) -> GroupEngines:
    """One length's engine figures over its suffix points."""
    if a is None:
        return b
    followups = accumulate(a.followups, b.followups) if a.followups is not None and b.followups is not None else None
    by_path = None
    if a.followups_by_path is not None and b.followups_by_path is not None:
        by_path = {
            path: accumulate(a.followups_by_path.get(path), b.followups_by_path[path])
            if path in b.followups_by_path
            else a.followups_by_path[path]
            for path in {*a.followups_by_path, *b.followups_by_path}
        }
    first = None
    if a.first_turns is not None and b.first_turns is not None:
        first = accumulate(a.first_turns, b.first_turns)
    whole = accumulate(a.all_turns, b.all_turns)
    return GroupEngines(all_turns=whole, followups=followups, followups_by_path=by_path, first_turns=first)


def point_spec(cfg: SweepConfig, point: Point) -> WorkloadSpec:
    spec = cfg.spec.with_prefix(point.length)
    spec = spec if point.suffix is None else spec.with_new_tokens(point.suffix)
    return spec if point.live is None else spec.live(point.live)


async def run_leg(
    ep: Endpoints,
    cfg: SweepConfig,
    leg: Leg | str,
    counter: TokenCounter,
    run_id: str,
    progress: Callable[[RequestRecord | None], None] | None = None,
) -> list[LegResult]:
    """Every point (prefix length, suffix) against one deployment; warmup first, kept out of
    the records.

    In the ON leg (or a --url run), each point's conversations are followed by the same
    workload, salted texts, sent whole straight to the first decode engine: the bound, a leg
    of its own. A named leg's texts are salted with its name (same sizes): it may run on the
    engines of the leg before, whose prefix caches hold that leg's prompts.
    """
    leg = leg if isinstance(leg, Leg) else Leg(leg)
    name = leg.name
    salt = f":{name}" if leg.named else ""
    async with aiohttp.ClientSession() as session:
        model = cfg.model or ep.served_model_name or await _model_name(session, ep.router_url)
        scraper = EngineScraper(session, ep.engine_urls)
        if cfg.warmup:
            warm = build(
                WorkloadSpec(
                    prefix_tokens=128, turns=2, conversations=1, user_tokens=16, tool_tokens=16, output_tokens=4
                ),
                counter,
                label=f"{run_id}-{name}-warmup",
            )
            await run(
                session,
                ep.router_url,
                model,
                warm,
                counter=counter,
                send_conversation_id=cfg.conversation_id,
                timeout_s=cfg.timeout_s,
            )
        main = LegResult(leg=name, records=[], errors=[])
        plan = await plan_bound(session, ep, cfg, name, model)
        bound = LegResult(leg=BOUND, records=[], errors=[]) if plan.url else None
        if plan.note:
            main.notes.append(plan.note)
        streams = None
        if cfg.background is not None:
            streams = BackgroundStreams(
                ep.router_url,
                model,
                cfg.background,
                counter,
                leg=name,
                label=f"{run_id}-{name}",
                timeout_s=cfg.timeout_s,
            )
            if not await asyncio.to_thread(streams.start):
                main.notes.append(f"background: not every stream decoded before the {name} leg's first turn")
        if scraper.enabled:
            main.capacity = {role: await scraper.capacity(role) for role in sorted(ep.engine_urls)}
        mix = cfg.spec.suffix_mix.name if cfg.spec.suffix_mix is not None else None
        try:
            for point in cfg.points():
                spec = point_spec(cfg, point)
                length = point.length
                workload = build(
                    replace(spec, text_salt=salt + point.salt), counter, label=f"{run_id}-{name}{point.label}"
                )
                decodes = ep.engine_urls.get("decode", [])
                before = await read_holds(session, decodes, release_unclaimed=True)  # from an empty decode
                res, engines = await _group(
                    session, scraper, ep.router_url, model, workload, counter, cfg, name, progress
                )
                after = await read_holds(session, decodes) if before is not None else None
                if before is not None and after is not None:
                    main.held[point] = after.since(before)
                main.engines[length] = _pooled(main.engines.get(length), engines)
                main.points[point] = engines
                main.records += _at_point(res.records, point, mix)
                main.errors += [{**e, **_point_fields(point), "leg": name} for e in res.errors]
                if bound is not None and plan.url is not None and plan.model is not None:
                    bound_spec = replace(spec, text_salt=BOUND_SALT + point.salt)
                    salted = build(bound_spec, counter, label=f"{run_id}-{BOUND}{point.label}")
                    res, engines = await _group(
                        session, scraper, plan.url, plan.model, salted, counter, cfg, BOUND, progress, bound=True
                    )
                    bound.engines[length] = _pooled(bound.engines.get(length), engines)
                    bound.points[point] = engines
                    bound.records += _at_point(res.records, point, mix)
                    bound.errors += [{**e, **_point_fields(point), "leg": BOUND} for e in res.errors]
                elif name in BOUND_LEGS and cfg.bound and progress is not None:
                    for _ in range(spec.turns * spec.conversations):  # the bar still reaches its total
                        progress(None)
        finally:
            if streams is not None:
                main.background = await asyncio.to_thread(streams.stop)
                main.notes += background_notes(name, main.background)
        main.notes += [f"engine metrics: {url} not reachable, its role left blank: {why}"
                       for url, why in scraper.unreachable.items()]  # fmt: skip
        main.router_stats = await _router_stats(session, ep.router_url)
    return [main] if bound is None else [main, bound]


def background_notes(leg: str, records: Sequence[StreamRecord]) -> list[str]:
    """What the streams did, said when they did not decode as planned."""
    failed = [r for r in records if r.error is not None]
    if not failed:
        return []
    return [f"background: {len(failed)} of the {leg} leg's {len(records)} stream requests failed: {failed[0].error}"]


def _at_point(records: list[RequestRecord], point: Point, mix: str | None = None) -> list[RequestRecord]:
    """The point's fields on its records; under a suffix mix each keeps its own turn's suffix."""
    for rec in records:
        if mix is None:
            rec.suffix_tokens = point.suffix
        rec.suffix_mix = mix
        rec.live_conversations = point.live
    return records


def _point_fields(point: Point) -> dict[str, int | None]:
    return {"prefix_tokens": point.length, "suffix_tokens": point.suffix, "live_conversations": point.live}


def run_sweep(
    target: Target,
    cfg: SweepConfig,
    counter_for: Callable[[Endpoints], TokenCounter],
    progress: Callable[[RequestRecord | None], None] | None = None,
    on_leg_start: Callable[[str], None] | None = None,
) -> list[LegResult]:
    """Each leg: deploy (flip), run every point; legs in `cfg.legs` order. The target stops
    what it runs after the last leg (locally, a leg may keep the engines of the leg before)."""
    run_id = f"pdx-{uuid.uuid4().hex[:8]}"
    results: list[LegResult] = []
    try:
        for leg in cfg.leg_list():
            if on_leg_start:
                on_leg_start(leg.name)
            with target.serve(leg) as ep:
                counter = counter_for(ep)
                results += asyncio.run(run_leg(ep, cfg, leg, counter, run_id, progress))
    finally:
        target.close()
    return results


def total_requests(cfg: SweepConfig) -> int:
    legs = cfg.leg_list()
    runs = len(legs) + (sum(1 for leg in legs if leg.name in BOUND_LEGS) if cfg.bound else 0)
    return runs * sum(point_spec(cfg, p).conversations for p in cfg.points()) * cfg.spec.turns


def all_records(results: Sequence[LegResult]) -> list[RequestRecord]:
    return [r for leg in results for r in leg.records]
