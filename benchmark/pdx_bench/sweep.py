"""The OFF/ON sweep over prefix lengths, and the places it can run: local, cluster, a URL.

A `Target` turns "bidirectional on/off" into a serving endpoint. Local and cluster flip the
same field of the same resource, `spec.kvTransfer.bidirectional`; locally the lead's runtime
re-renders and restarts the processes, in a cluster the operator rolls the engines and the
target waits for the status to say the new config serves. A URL target serves what runs.
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

from .client import RunResult, run
from .enginemetrics import EngineScraper, GroupEngines, snapshot_delta, xfer_totals
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


class Target(Protocol):
    """Serves a leg. `bidirectional=None` means "as it is" (no flip)."""

    description: str

    def serve(self, bidirectional: bool | None) -> contextlib.AbstractContextManager[Endpoints]: ...


def set_bidirectional(document: dict[str, Any], value: bool) -> dict[str, Any]:
    """A copy of a DisaggregatedInference document with the switch set (the user's own edit)."""
    doc = copy.deepcopy(document)
    doc.setdefault("spec", {}).setdefault("kvTransfer", {})["bidirectional"] = value
    return doc


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
    def serve(self, bidirectional: bool | None) -> Iterator[Endpoints]:
        if bidirectional is not None:
            raise ValueError("a URL target cannot flip bidirectional; use --local or --cluster for a sweep")
        yield Endpoints(self.url, self.engine_urls, self.model_dir)


TopologyFactory = Callable[[dict[str, Any], Path | None], Any]


def _local_topology(document: dict[str, Any], state_dir: Path | None) -> Any:
    from pdx.local.topology import LocalTopology

    return LocalTopology(document, state_dir)


class LocalTarget:
    """The CR run as local processes by `pdx.local`; each leg re-renders and restarts them."""

    def __init__(
        self,
        document: dict[str, Any],
        state_dir: Path | None = None,
        factory: TopologyFactory | None = None,
        on_ready: Callable[[Endpoints], None] | None = None,
        on_leg_end: Callable[[], None] | None = None,
    ) -> None:
        self.document = document
        self.state_dir = state_dir
        self.factory = factory or _local_topology
        self.on_ready = on_ready  # each leg's engines and router, once they serve (e.g. to scrape them)
        self.on_leg_end = on_leg_end  # while they still serve, after the leg's last turn
        self.description = f"local topology of {document.get('metadata', {}).get('name', '?')}"
        self.start_seconds: dict[str, float] = {}
        self.peak_rss_mib: dict[str, dict[str, float]] = {}

    @contextlib.contextmanager
    def serve(self, bidirectional: bool | None) -> Iterator[Endpoints]:
        doc = self.document if bidirectional is None else set_bidirectional(self.document, bidirectional)
        t0 = time.monotonic()
        with self.factory(doc, self.state_dir) as topo:
            self.start_seconds[_leg(bidirectional)] = time.monotonic() - t0
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
            finally:  # read while the processes still run
                if self.on_leg_end is not None:
                    self.on_leg_end()
                self.peak_rss_mib[_leg(bidirectional)] = dict(topo.peak_rss_mib())


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
        before = self._get()
        current = before.get("spec", {}).get("kvTransfer", {}).get("bidirectional", True)
        t0 = self._clock()
        if current != bidirectional:
            patch = {"spec": {"kvTransfer": {"bidirectional": bidirectional}}}
            self.api.patch_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.name, patch, _content_type="application/merge-patch+json"
            )
        obj = self.wait_rolled_out(
            previous_hash=before.get("status", {}).get("configHash"), changed=current != bidirectional
        )
        self.rollout_seconds[_leg(bidirectional)] = self._clock() - t0
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
    def serve(self, bidirectional: bool | None) -> Iterator[Endpoints]:
        obj = self.flip(bidirectional) if bidirectional is not None else self._get()
        status = obj.get("status") or {}
        url = self.router_url or status.get("routerAddress")
        if not url:
            raise RuntimeError(f"{self.description} has no status.routerAddress; pass --router-url")
        yield Endpoints(
            router_url=str(url),
            engine_urls=self.engine_urls(status.get("configHash")),
            served_model_name=served_model_name(obj),
        )


def _leg(bidirectional: bool | None) -> str:
    return {True: "on", False: "off", None: "run"}[bidirectional]


# ------------------------------------------------------------------------------------ sweep


@dataclass
class SweepConfig:
    lengths: list[int]
    spec: WorkloadSpec
    legs: list[bool | None] = field(default_factory=lambda: [False, True])
    warmup: bool = True
    timeout_s: float = 300.0
    model: str | None = None  # served model name; else the leg's, else the router's /v1/models
    bound: bool = True  # in the ON leg, each length's workload once more straight to decode
    conversation_id: bool = True  # send each conversation's id; False: the router finds it by its history


BOUND = "bound"
BOUND_LEGS = ("on", "run")  # the legs whose topology the bound is measured on (run: --url)
BOUND_SALT = ":bound"  # the bound's texts differ from ON's, sizes equal: decode caches ON's prompts


@dataclass
class LegResult:
    leg: str
    records: list[RequestRecord]
    errors: list[dict[str, Any]]
    router_stats: dict[str, Any] | None = None
    engines: dict[int, GroupEngines] = field(default_factory=dict)  # per prefix length
    notes: list[str] = field(default_factory=list)


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
    engines = GroupEngines(all_turns=snapshot_delta(await scraper.snapshot(), before), followups=res.followups)
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


async def run_leg(
    ep: Endpoints,
    cfg: SweepConfig,
    leg: str,
    counter: TokenCounter,
    run_id: str,
    progress: Callable[[RequestRecord | None], None] | None = None,
) -> list[LegResult]:
    """All prefix lengths against one deployment; warmup first, kept out of the records.

    In the ON leg (or a --url run), each length's conversations are followed by the same
    workload, salted texts, sent whole straight to the first decode engine: the bound, a leg
    of its own.
    """
    async with aiohttp.ClientSession() as session:
        model = cfg.model or ep.served_model_name or await _model_name(session, ep.router_url)
        scraper = EngineScraper(session, ep.engine_urls)
        if cfg.warmup:
            warm = build(
                WorkloadSpec(
                    prefix_tokens=128, turns=2, conversations=1, user_tokens=16, tool_tokens=16, output_tokens=4
                ),
                counter,
                label=f"{run_id}-{leg}-warmup",
            )
            await run(session, ep.router_url, model, warm, counter=counter, timeout_s=cfg.timeout_s)
        main = LegResult(leg=leg, records=[], errors=[])
        plan = await plan_bound(session, ep, cfg, leg, model)
        bound = LegResult(leg=BOUND, records=[], errors=[]) if plan.url else None
        if plan.note:
            main.notes.append(plan.note)
        for length in cfg.lengths:
            spec = cfg.spec.with_prefix(length)
            res, main.engines[length] = await _group(
                session, scraper, ep.router_url, model, build(spec, counter, label=f"{run_id}-{leg}"),
                counter, cfg, leg, progress,
            )  # fmt: skip
            main.records += res.records
            main.errors += [{**e, "prefix_tokens": length, "leg": leg} for e in res.errors]
            if bound is not None and plan.url is not None and plan.model is not None:
                salted = build(replace(spec, text_salt=BOUND_SALT), counter, label=f"{run_id}-{BOUND}")
                res, bound.engines[length] = await _group(
                    session, scraper, plan.url, plan.model, salted, counter, cfg, BOUND, progress, bound=True
                )
                bound.records += res.records
                bound.errors += [{**e, "prefix_tokens": length, "leg": BOUND} for e in res.errors]
            elif leg in BOUND_LEGS and cfg.bound and progress is not None:
                for _ in range(spec.turns * spec.conversations):  # the bar still reaches its total
                    progress(None)
        main.notes += [f"engine metrics: {url} not reachable, its role left blank: {why}"
                       for url, why in scraper.unreachable.items()]  # fmt: skip
        main.router_stats = await _router_stats(session, ep.router_url)
    return [main] if bound is None else [main, bound]


def run_sweep(
    target: Target,
    cfg: SweepConfig,
    counter_for: Callable[[Endpoints], TokenCounter],
    progress: Callable[[RequestRecord | None], None] | None = None,
    on_leg_start: Callable[[str], None] | None = None,
) -> list[LegResult]:
    """Each leg: deploy (flip), run every length, tear down; legs in `cfg.legs` order."""
    run_id = f"pdx-{uuid.uuid4().hex[:8]}"
    results: list[LegResult] = []
    for bidir in cfg.legs:
        leg = _leg(bidir)
        if on_leg_start:
            on_leg_start(leg)
        with target.serve(bidir) as ep:
            counter = counter_for(ep)
            results += asyncio.run(run_leg(ep, cfg, leg, counter, run_id, progress))
    return results


def total_requests(cfg: SweepConfig) -> int:
    legs = len(cfg.legs) + (sum(1 for b in cfg.legs if _leg(b) in BOUND_LEGS) if cfg.bound else 0)
    return legs * len(cfg.lengths) * cfg.spec.turns * cfg.spec.conversations


def all_records(results: Sequence[LegResult]) -> list[RequestRecord]:
    return [r for leg in results for r in leg.records]
