"""The DisaggregatedInference API: pydantic models that are the single source of truth.

The CRD schema (`pdx.crd`), the defaults, the validation messages, the renderer, the local
runtime and the operator all read these models. Field docstrings become the CRD's
descriptions, so `kubectl explain disaggregatedinference.spec.kvTransfer` is the manual.
Cross-field facts are CEL rules (`pdx.rules`) that the models evaluate too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from pdx import labels
from pdx.profiles import DEFAULT_INSTANCE_TYPE, PROFILES, InstanceProfile
from pdx.protocol import PREFILL_DECLINE_WINDOW_SECONDS
from pdx.rules import check_document
from pdx_contract.router_config import CLAIM_QUEUE_TOKENS, CacheIsolation

GROUP = "inference.pdx.dev"
VERSION = "v1alpha1"
KIND = "DisaggregatedInference"
PLURAL = "disaggregatedinferences"
SINGULAR = "disaggregatedinference"
SHORT_NAMES = ["dinf"]
API_VERSION = f"{GROUP}/{VERSION}"

# The router's deadline for an entry ends before prefill would decline the read
# (PREFILL_DECLINE_WINDOW_SECONDS), by default with a wider safety margin.
ROUTER_TTL_MARGIN_SECONDS = 30

# The status conditions, in the order status lists them, each with what True means. The
# operator writes exactly these; the CRD documents them from here.
CONDITIONS: dict[str, str] = {
    "Ready": "requests can be served: a prefill/decode pair of the published config and a router",
    "PrefillAvailable": "at least one prefill pod is ready",
    "DecodeAvailable": "at least one decode pod is ready",
    "RouterAvailable": "at least one router pod is ready",
    "Progressing": "a rollout, scale or start-up is still moving",
    "Degraded": "something needs a person: a rejected edit, a failed apply, failing pods, no EFA",
    "InvalidSpec": "the last edit was rejected; the fleet keeps the previous config",
    "EFAAvailable": "no engine refused to start for want of EFA",
    "HeldKvPinned": "some decode keeps held KV until a read or the TTL (no valve): new work waits when it fills",
}

Quantity = Annotated[str, Field(pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|m|k|M|G|T)?$")]
# `vllm serve` arguments: bounded so that the API server can cost the CEL rules that read them
# (router.firstTokenFromPrefill's); far above what a command line of vLLM flags holds.
EngineArgs = Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=128)]


class _Spec(BaseModel):
    """Base: camelCase on the wire, unknown fields rejected (a typo must not pass silently).

    Strict types, as the API server's schema has them: "2" is no integer and "false" no boolean
    (lax pydantic took both, the server refuses them). What the server does accept beyond
    strict JSON types (nulls, 2.0 for an integer) `pdx.resource.decoded` turns into what it
    stores before these models see it.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        strict=True,
        use_attribute_docstrings=True,
    )


class ModelSpec(_Spec):
    """The model both roles serve."""

    name: str = Field(min_length=1)
    """Hugging Face hub id or a path inside the model cache (e.g. Qwen/Qwen3-32B)."""
    served_model_name: str | None = None
    """Name clients use in requests; defaults to `name`."""
    revision: str | None = None
    """Hub revision (branch, tag or commit) to pin the weights."""
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """Weight and activation dtype passed to vLLM (--dtype)."""
    max_model_len: int | None = Field(default=None, ge=16)
    """Context length (--max-model-len); unset lets vLLM take the model's."""
    max_num_seqs: int | None = Field(default=None, ge=1)
    """Concurrent sequences per engine (--max-num-seqs)."""
    load_format: str | None = None
    """vLLM --load-format (e.g. `dummy` for random weights in tests)."""
    extra_args: EngineArgs = Field(default_factory=list)
    """Extra `vllm serve` arguments given to both roles (at most 128, each at most 4096 characters)."""

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.name


class ImageSpec(_Spec):
    """A container image and how to pull it."""

    repository: str = "ghcr.io/pdx-dev/vllm-efa"
    """Image repository."""
    tag: str = "0.33.0"
    """Image tag (or digest with `sha256:` prefix)."""
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """Kubernetes imagePullPolicy."""
    pull_secrets: list[str] = Field(default_factory=list)
    """Names of image pull secrets in the resource's namespace."""

    @property
    def ref(self) -> str:
        sep = "@" if self.tag.startswith("sha256:") else ":"
        return f"{self.repository}{sep}{self.tag}"


class SecretKeyRef(_Spec):
    """A key in a Secret of the resource's namespace."""

    name: str = Field(min_length=1)
    """Secret name."""
    key: str = "token"
    """Key within the Secret."""


class ModelCacheSpec(_Spec):
    """Where weights are cached; shared by restarts when a PVC is given."""

    claim_name: str | None = None
    """PersistentVolumeClaim holding the cache; unset uses an emptyDir (downloads each start)."""
    mount_path: str = Field(default="/models", pattern=r"^/")
    """Mount path of the cache in the engine containers."""
    hf_home: str | None = Field(default=None, pattern=r"^/")
    """HF_HOME; defaults to `<mountPath>/huggingface`."""

    @property
    def hf_home_path(self) -> str:
        return self.hf_home or f"{self.mount_path.rstrip('/')}/huggingface"


class Resources(_Spec):
    """Extra resource requests/limits; GPUs and EFA devices are derived unless given."""

    gpus: int | None = Field(default=None, ge=0)
    """nvidia.com/gpu per pod; defaults to tensorParallelSize on GPU instance types."""
    efa_devices: int | None = Field(default=None, ge=0)
    """vpc.amazonaws.com/efa per pod; defaults to the node's EFA count scaled by GPUs used."""
    cpu: Quantity | None = None
    """CPU request (and limit when `limitCpu` is set)."""
    memory: Quantity | None = None
    """Memory request and limit."""
    limit_cpu: bool = False
    """Also set the CPU limit to the request."""


class Probes(_Spec):
    """Probe timing fit for long model loads (tens of minutes for a 300B checkpoint)."""

    startup_timeout_seconds: int = Field(default=3600, ge=30)
    """How long an engine may take to become healthy before Kubernetes restarts it."""
    period_seconds: int = Field(default=10, ge=1)
    """Probe period once started."""
    failure_threshold: int = Field(default=3, ge=1)
    """Consecutive failures before the pod is unready (readiness) or restarted (liveness)."""


class AutoscalingSpec(_Spec):
    """A HorizontalPodAutoscaler for one role, on a per-pod metric the engines export (served to
    the HPA by a metrics adapter, e.g. prometheus-adapter; see docs/operator.md)."""

    min_replicas: int = Field(default=1, ge=1)
    """Fewest engine pods."""
    max_replicas: int = Field(ge=1)
    """Most engine pods."""
    metric: str | None = Field(default=None, min_length=1)
    """The per-pod metric's name as the adapter serves it; unset: `vllm_num_requests_waiting`
    for prefill (its queue) and `vllm_kv_cache_usage_perc` for decode (KV in use, the KV held
    for reuse included)."""
    target: Quantity | None = None
    """The metric's per-pod average to hold; unset: 2 waiting requests for prefill, 0.7 of the
    KV cache for decode."""
    scale_down_period_seconds: int = Field(default=120, ge=15)
    """At most one pod removed per period: a decode drains (its conversations move) before the
    next goes."""


class RoleSpec(_Spec):
    """One engine fleet: prefill or decode (same shape)."""

    replicas: int = Field(default=1, ge=0)
    """Engine pods of this role (xPyD); with `autoscaling`, the autoscaler sets them instead."""
    autoscaling: AutoscalingSpec | None = None
    """Scale this role with a HorizontalPodAutoscaler; unset: `replicas` pods."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """--tensor-parallel-size; must fit the node's GPUs."""
    resources: Resources = Field(default_factory=Resources)
    """Resources beyond the derived GPUs and EFA devices."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels added to the instance profile's."""
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    """Tolerations added to the GPU taint toleration."""
    affinity: dict[str, Any] | None = None
    """Pod affinity/anti-affinity (Kubernetes Affinity object)."""
    prefix_caching: bool | None = None
    """vLLM automatic prefix caching; unset: on, except on prefill under profile `benchmark`."""
    extra_args: EngineArgs = Field(default_factory=list)
    """Extra `vllm serve` arguments for this role only (at most 128, each at most 4096 characters)."""
    tokenize_cache: Quantity = "64Mi"
    """Token ids of prompts' leading parts kept by each engine's API server, so a conversation's
    next turn tokenizes only what it added (pdx_engine.tokenize_cache; the ids are exactly a whole
    tokenization's). 64Mi holds ~16M tokens: ~700 conversations at 24k; `0` turns it off."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for this role's engines."""
    shm_size: Quantity | None = None
    """Size of /dev/shm; defaults to the instance profile's."""
    probes: Probes = Field(default_factory=Probes)
    """Health probe timing."""


# The KV block size rendered for GPU engines (KvTransferSpec.block_size says why).
GPU_BLOCK_SIZE = 128
# router.decodeLocalMaxTokens unset, on GPUs (RouterSpec.decode_local_max_tokens says why).
GPU_DECODE_LOCAL_MAX_TOKENS = 1024
# router.decodeLocalIdleMaxTokens unset, on GPUs (RouterSpec.decode_local_idle_max_tokens says why).
GPU_DECODE_LOCAL_IDLE_MAX_TOKENS = 8192
# router.claimQueueTokens unset, on GPUs and on CPUs (RouterSpec.claim_queue_tokens says why).
GPU_CLAIM_QUEUE_TOKENS = CLAIM_QUEUE_TOKENS  # the router's own default
CPU_CLAIM_QUEUE_TOKENS = 2048

# kv_lease_duration (vLLM 0.32 nixl/base_scheduler.py, base_worker.py): decode heartbeats every
# lease // 6 s, each renewal holds prefill's blocks lease * 2 // 3 s from its arrival.
KV_LEASE_HEARTBEATS = 6
# The smallest lease whose heartbeat interval is at least 1 s: below 6 it is 0 and decode sends
# heartbeats on every engine step; at 1 a renewal adds 0 s, and at 0 prefill frees the blocks at once.
MIN_KV_LEASE_SECONDS = KV_LEASE_HEARTBEATS
# Only the lease frees the blocks of a request that no decode ever takes (heartbeats renew what a
# decode still waits for): beyond an hour a longer lease is a leak, not a margin.
MAX_KV_LEASE_SECONDS = 3600


class KvTransferSpec(_Spec):
    """NixlConnector settings; rendered identically into both roles."""

    bidirectional: bool = True
    """bidirectional_kv_xfer: decode keeps finished blocks so the next turn's prefill reads them back (D->P)."""
    decoder_kv_blocks_ttl_seconds: int = Field(default=480, ge=PREFILL_DECLINE_WINDOW_SECONDS + 1)
    """decoder_kv_blocks_ttl: seconds decode keeps a finished turn's blocks for reuse (at least 6:
    prefill declines a read within 5 s of expiry, so a shorter TTL could never be reused)."""
    kv_recompute_threshold: int = Field(default=64, ge=0)
    """kv_recompute_threshold: fewest reusable tokens worth a remote read instead of recompute."""
    release_under_pressure: bool = True
    """Held KV is a cache: when a request would wait for KV blocks, decode first releases held turns
    the router has not claimed for a read, those whose conversations come back last first (pdx's
    engine plugin); their next turn is `released` and recomputed. Off: held turns stay until read or
    past the TTL, and new work waits."""
    held_kv_max_fraction: float | None = Field(default=None, gt=0, le=1)
    """The share of decode's KV cache held KV may keep from new work (e.g. 0.5): when a turn ends with less
    than the rest of the cache free, decode releases held turns at once, those whose conversations come
    back last first, so new work finds that room without a release on its path. Unset: held KV may fill
    the cache and yields only when a request needs blocks. Needs releaseUnderPressure."""
    kv_lease_duration_seconds: int = Field(default=120, ge=MIN_KV_LEASE_SECONDS, le=MAX_KV_LEASE_SECONDS)
    """kv_lease_duration: seconds prefill holds a finished prefill's blocks for decode to read (vLLM: 30).
    Decode's heartbeats renew it (every 1/6 of it, by 2/3 of it), but only once decode's scheduler has the request.
    Before that come prefill's answer, the router, decode's HTTP server and tokenizer, queues, a NIXL handshake.
    They must fit in 2/3 of the lease: past it prefill reuses the blocks and decode reads wrong KV with no error.
    30 s was too short under load (aws-samples/aws-do-eks#84: stale KV on 8 of 42 requests); 120 leaves them 80 s.
    The cost: blocks that no decode takes stay held that long. At least 6 (a 1 s heartbeat), at most 3600."""
    backends: list[Literal["LIBFABRIC", "UCX"]] | None = Field(default=None, min_length=1)
    """NIXL backends; unset: LIBFABRIC where the node has EFA (UCX on EFA silently runs over TCP), else UCX."""
    kv_buffer_device: Literal["cuda", "cpu"] | None = None
    """Where KV buffers live; unset: cuda on GPU instance types, cpu otherwise."""
    side_channel_port: int = Field(default=5600, ge=1024, le=65535)
    """VLLM_NIXL_SIDE_CHANNEL_PORT (NIXL handshake)."""
    load_failure_policy: Literal["fail", "recompute"] = "fail"
    """kv_load_failure_policy; `fail` answers 500 and the router retries without reuse."""
    block_size: Literal[16, 32, 64, 128, 256] | None = None
    """KV cache block size in tokens (--block-size), the same on both roles. Unset: 128 on GPUs,
    the platform's own on CPU (128). NIXL posts one descriptor per block and layer, so small blocks
    make D->P reads slow to post: on an H200 a 16k-token read spent 48 ms posting at vLLM's default
    of 16, 29 ms at 64 and 15 ms at 128, where ON's TTFT through prefill fell from 196 to 162 ms
    (16.7k tokens; docs/results/h200-2026-12-03b). Larger blocks also make prefix-cache hits
    coarser (up to a block recomputed)."""


class PlacementSpec(_Spec):
    """Node placement from an instance-type profile; every derived value can be overridden."""

    instance_type: str = DEFAULT_INSTANCE_TYPE
    """node.kubernetes.io/instance-type; profiles: p5en.48xlarge, p5.48xlarge, p5e.48xlarge, p4d.24xlarge,
    gpu (any NVIDIA GPU machine without EFA, e.g. `pdx local` on a GPU box), cpu."""
    gpus_per_node: int | None = Field(default=None, ge=0)
    """GPUs per node; required for instance types without a profile."""
    efa_devices_per_node: int | None = Field(default=None, ge=0)
    """EFA devices per node; required for instance types without a profile."""
    hugepages2_mi: Quantity | None = Field(default=None, alias="hugepages2Mi")
    """hugepages-2Mi per engine pod (libfabric/EFA buffers)."""
    gpu_taint_toleration: bool | None = None
    """Tolerate the nvidia.com/gpu NoSchedule taint; defaults to the profile's."""
    privileged: bool = False
    """Run engines privileged (some EFA setups); otherwise every capability is dropped but IPC_LOCK and
    SYS_RESOURCE (with EFA), with no privilege escalation and the runtime's default seccomp profile."""
    fi_env: dict[str, str] = Field(default_factory=dict)
    """libfabric/NIXL environment merged over the profile's (FI_PROVIDER=efa, ...)."""
    efa_check: bool | None = None
    """Fail engine start-up unless the EFA provider is present (no silent TCP); default on with EFA."""

    @property
    def profile(self) -> InstanceProfile:
        known = PROFILES.get(self.instance_type)
        if known is not None:
            return known
        return InstanceProfile(gpus=self.gpus_per_node or 0, efa_devices=self.efa_devices_per_node or 0)

    @property
    def gpus(self) -> int:
        return self.gpus_per_node if self.gpus_per_node is not None else self.profile.gpus

    @property
    def efa_devices(self) -> int:
        if self.efa_devices_per_node is not None:
            return self.efa_devices_per_node
        return self.profile.efa_devices


class RouterStoreSpec(_Spec):
    """Where the router keeps conversation entries."""

    kind: Literal["memory", "redis"] = "memory"
    """`memory` (per replica) or `redis` (shared by all router replicas)."""
    url: str | None = Field(default=None, pattern=r"^rediss?://")
    """Redis URL, required for kind `redis`."""
    max_bytes: Quantity = "512Mi"
    """The entries' bytes, all tenants together (token ids as their text, ~6.5 bytes a token;
    decode's block metadata; a fixed overhead each); beyond it the oldest entries go. In memory: per router
    replica, and the router's memory limit is derived from it (unless `resources.memory` is
    set). In Redis: the values' bytes there."""
    max_bytes_per_tenant: Quantity | None = None
    """One tenant's share of `maxBytes`: a tenant beyond it drops its own oldest entries, never
    another tenant's. Unset: a quarter of `maxBytes`."""


class TenancySpec(_Spec):
    """How the router tells tenants apart: conversations, and the KV behind them, are shared only
    within one tenant, and a client without an identity shares nothing."""

    identity: Literal["apiKey", "header", "single"] = "apiKey"
    """`apiKey`: the client's Authorization header. `header`: a header your gateway sets, always
    overwriting the client's (the router cannot tell a forged one), combined with the API key.
    `single`: one trusted client, such as the local demo or a benchmark: everyone shares."""
    header: str | None = Field(default=None, min_length=1)
    """For identity `header`: the header's name, e.g. `X-Tenant`."""
    cache_isolation: CacheIsolation = "tenant"
    """`tenant`: the router gives each tenant's requests a `cache_salt` of its own (a client's own salt
    folded in), so no engine cache, held KV included, shares a block across tenants, and no tenant can
    tell from TTFT whether another recently sent a prompt. `shared`: one prefix cache for all (one system
    prompt cached once), accepting that timing side channel; the client's salt passes as sent."""


class RouterImageSpec(ImageSpec):
    """The router's image (same fields, its own defaults)."""

    repository: str = "ghcr.io/pdx-dev/pdx-router"
    """Image repository."""
    tag: str = "0.1.0"
    """Image tag (or digest with `sha256:` prefix)."""


class RouterSpec(_Spec):
    """The KV-cache-aware router."""

    replicas: int = Field(default=1, ge=0)
    """Router pods; more than one needs store kind `redis` to share entries."""
    image: RouterImageSpec = Field(default_factory=RouterImageSpec)
    """Router image."""
    port: int = Field(default=8000, ge=1, le=65535)
    """Port of the router's OpenAI-compatible API."""
    conversation_ttl_seconds: int | None = Field(default=None, ge=1)
    """Router deadline for a stored entry; default: decoder TTL minus a 30 s margin (450 for 480)."""
    max_entries: int = Field(default=100000, ge=1)
    """Conversation entries kept (LRU beyond)."""
    tenancy: TenancySpec = Field(default_factory=TenancySpec)
    """How tenants are told apart."""
    tenant_header: str | None = Field(default=None, min_length=1)
    """Deprecated: use `tenancy` (identity `header`). Still read as that identity, now combined
    with the API key."""
    conversation_from: Literal["id", "history", "both"] = "both"
    """How the router finds a turn's conversation: `id` (the body's `conversation_id` or the
    X-Session-ID header), `history` (the messages up to an assistant turn, so any OpenAI client
    reuses without sending an id), or `both` (an id when sent, else the history)."""
    decode_local_max_tokens: int | None = Field(default=None, ge=0, le=1 << 20)
    """A follow-up turn whose new tokens (beyond what its conversation's decode holds) are at most
    this is prefilled on that decode, from its own prefix cache: no prefill hop, no D->P read.
    0: every turn goes through prefill. Unset: 1024 on GPUs, 0 on CPU. On an H200 a local turn of
    128-1024 new tokens answered in 0.38-0.60x the D->P path's TTFT at 8k-24k tokens of history
    (docs/results/h200-2026-12-04). A local prefill delays the next token of every stream that
    decode generates: there one eager step of 30-45 ms whatever the suffix, +3-36% on the streams'
    TPOT p90 during the turn; GPU decodes now capture CUDA graphs large enough for it (unmeasured).
    Hence the bound and decodeLocalMaxBusy."""
    decode_local_max_busy: int = Field(default=4, ge=1)
    """A turn goes decode-local only while its decode has fewer requests in flight than this
    (the router's count, or the engine's running + waiting, whichever is higher)."""
    decode_local_idle_max_tokens: int | None = Field(default=None, ge=0, le=1 << 20)
    """While its decode has nothing in flight (the same count), a follow-up turn of up to this many
    new tokens goes decode-local too: a tool's output or a file, which decodeLocalMaxTokens sends
    the D->P way. An idle decode delays no stream, and the same turn sent whole to the decode that
    holds it is the bound the D->P path is measured against (the D->P path answered 2k-token
    suffixes in 1.5-1.6x of it on an H100, docs/results/h100-2026-12-06-wave). A request arriving
    during the local prefill waits for it (for a chunk of it). 0: off; at least
    decodeLocalMaxTokens when set; decode-local off turns it off too. Unset: 8192 on GPUs, 0 on
    CPU (where decode's prefill is slower than prefill's, docs/router.md)."""
    claim_queue_tokens: int | None = Field(default=None, ge=0, le=1 << 30)
    """A follow-up turn that reads decode's held KV claims it (pins it against release under
    pressure) only once its prefill has at most this many prompt tokens of the router's requests
    still to compute (estimated from their bodies' size); until then it waits in the router, its
    hold still releasable. Claimed on arrival instead (set it very high), a turn queued behind
    long prefills pins its hold for the whole wait, and a decode full of such holds makes new
    work wait (docs/results/h100-2026-12-05-wave). It stands for about a second of prefill's
    work. Unset: 32768 on GPUs, 2048 on CPU, where prefill computes a few thousand tokens a
    second: with 32768 CPU claims pinned holds for seconds and requests waited behind them at
    3.9x overcommit (docs/results/cpu-2026-12-07c-prefill-uncached)."""
    first_token_from_prefill: bool = False
    """Stream a P/D turn's first token from prefill, as soon as prefill answers: prefill samples
    one token anyway, and the client's first token otherwise waits for decode's hop (its API, the
    P->D read, its first step: 30-60 ms on an H100 at 12k-20k tokens). Decode then starts with that
    token (a logits processor, `pdx_engine.first_token`, rendered onto decode) and the router cuts
    what decode streams of it, so the text is what decode alone would send. Streamed turns of one
    choice only, without log-probabilities, a seed, tools or structured output; the first chunk's
    id is the router's. Needs decode without a reasoning or tool parser, speculative decoding or
    logits processors of its own. Off: the first token is decode's."""
    prefill_affinity: bool | None = None
    """Send every turn of a conversation to one prefill (rendezvous hashing of its id, else of its
    messages through the first user message), so that prefill's prefix cache may still hold its
    history; off: the least loaded prefill. Unset: on where prefill's prefix cache is on. Only
    matters with several prefills; a prefill that goes away moves only its own conversations."""
    reuse_headers: bool = False
    """Answer with X-PDX-Reuse, X-PDX-Reused-Tokens, X-PDX-Prefill-Ms and X-PDX-Router-Ms. They
    describe the stored entries: turn them on only for trusted clients (a benchmark, the local demo)."""
    store: RouterStoreSpec = Field(default_factory=RouterStoreSpec)
    """Entry store."""
    tokenizer: Literal["engine", "router"] = "engine"
    """Who tokenizes a reused chat turn for the prefix check: `engine` (a /tokenize call to prefill)
    or `router` (the model's own tokenizer, read from `model.name` on the model cache PVC, mounted
    read-only; used once it has matched the engine on 8 prompts, and given up on any mismatch).
    Only for engines that do not check the prefix themselves: with pdx's engine plugin (in the
    serving image and `pdx local`) neither is asked, the engines compare the tokens."""
    resources: Resources = Field(default_factory=lambda: Resources(cpu="1"))
    """Router resources. Unset memory is derived from the entry store's bound: store.maxBytes x
    1.5 + 256Mi for store kind memory (1Gi for the default 512Mi), 256Mi for redis."""

    def effective_tenancy(self) -> TenancySpec:
        """The deprecated `tenantHeader` as the identity it now means."""
        if self.tenant_header is not None:
            return TenancySpec(
                identity="header", header=self.tenant_header, cache_isolation=self.tenancy.cache_isolation
            )
        return self.tenancy

    def effective_ttl(self, decoder_ttl: int) -> int:
        """Entries must die before decode drops the blocks (and before prefill declines reads)."""
        if self.conversation_ttl_seconds is not None:
            return self.conversation_ttl_seconds
        margin = (
            ROUTER_TTL_MARGIN_SECONDS if decoder_ttl > 2 * ROUTER_TTL_MARGIN_SECONDS else PREFILL_DECLINE_WINDOW_SECONDS
        )
        return decoder_ttl - margin  # >= 1: the decoder TTL is at least the decline window + 1


class LabelSelectorRequirement(_Spec):
    """One matchExpressions entry of a Kubernetes label selector."""

    key: str = Field(min_length=1)
    """Label key."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    """How the label's value relates to `values`."""
    values: list[str] | None = None
    """Values for In and NotIn; none for Exists and DoesNotExist."""


class LabelSelector(_Spec):
    """A Kubernetes label selector; `{}` selects everything (all pods, or all namespaces)."""

    match_labels: dict[str, str] | None = None
    """Labels that must all be present with these values."""
    match_expressions: list[LabelSelectorRequirement] | None = None
    """Requirements that must all hold."""


class IPBlock(_Spec):
    """A CIDR range of a NetworkPolicy peer, minus sub-ranges."""

    cidr: str = Field(pattern=r"^[0-9a-fA-F.:]+/[0-9]{1,3}$")
    """e.g. 10.0.0.0/16 or 2001:db8::/64."""
    except_: list[str] | None = Field(default=None, alias="except")
    """Sub-ranges of `cidr` left out."""


class NetworkPeer(_Spec):
    """A NetworkPolicy peer, as Kubernetes writes it: `ipBlock` alone, or pod and/or namespace
    selectors (a podSelector alone means pods of the resource's own namespace)."""

    pod_selector: LabelSelector | None = None
    """Pods selected by labels (in the selected namespaces, else the resource's)."""
    namespace_selector: LabelSelector | None = None
    """Namespaces selected by labels (`{}`: every namespace)."""
    ip_block: IPBlock | None = None
    """Addresses outside the pod network (a load balancer, a VPN range)."""


MAX_PEERS = 32  # bounds the CEL cost of the peer rules


def _operator_peer() -> list[NetworkPeer]:
    return [
        NetworkPeer(
            namespace_selector=LabelSelector(),
            pod_selector=LabelSelector(match_labels=labels.operator_pods()),
        )
    ]


class NetworkSpec(_Spec):
    """Who may reach the router and the engines beyond what pdx needs itself (the rendered
    NetworkPolicies admit the router to the engines and each role to the other on their own)."""

    clients: list[NetworkPeer] | None = Field(default=None, max_length=MAX_PEERS)
    """Who may call the router's API port; unset: anyone (any pod, and outside clients that a
    LoadBalancer or Ingress lets in); `[]`: nobody but `operator` and `metricsScrapers`."""
    metrics_scrapers: list[NetworkPeer] = Field(default_factory=list, max_length=MAX_PEERS)
    """Who may scrape /metrics: the engines' HTTP port and the router's port (the router
    serves /metrics there too); empty: nobody beyond `clients`."""
    operator: list[NetworkPeer] = Field(default_factory=_operator_peer, max_length=MAX_PEERS)
    """Who may read the router's /v1/pdx/stats (the operator's reuse advice); default: pods
    labelled as the chart labels the operator, in any namespace. Narrow it with a
    namespaceSelector for the operator's namespace."""
    model_download: list[NetworkPeer] | None = Field(default=None, max_length=MAX_PEERS)
    """Where engines may open HTTPS (port 443) to fetch weights; unset: any public address
    (every address but private, shared, loopback and link-local ranges, so never the node's
    metadata service); `[]`: none (weights already on the model cache PVC; set HF_HUB_OFFLINE=1
    in the roles' env so vLLM does not try)."""


class MonitoringSpec(_Spec):
    """Scraping by the Prometheus Operator (docs/observability.md)."""

    pod_monitors: bool = False
    """Render a PodMonitor (monitoring.coreos.com/v1) for the engines' and the router's /metrics.
    Needs the Prometheus Operator's CRDs; off, nothing of theirs is rendered."""


class DisaggregatedInferenceSpec(_Spec):
    """A prefill fleet, a decode fleet and a KV-cache-aware router with bidirectional KV transfer."""

    model: ModelSpec
    """The served model."""
    profile: Literal["production", "benchmark"] = "production"
    """`benchmark` turns prefix caching off on prefill (models eviction, as in the seed's measurements)."""
    image: ImageSpec = Field(default_factory=ImageSpec)
    """vLLM serving image (vLLM with NIXL and the EFA userspace)."""
    model_cache: ModelCacheSpec = Field(default_factory=ModelCacheSpec)
    """Weight cache volume."""
    hf_token_secret: SecretKeyRef | None = None
    """Secret with the Hugging Face token, mounted read-only as a file that HF_TOKEN_PATH names (not an env var)."""
    engine_api_key_secret: SecretKeyRef | None = None
    """Secret with an API key the engines require (vLLM's --api-key, as VLLM_API_KEY): the router
    sends it in place of the client's key, so the engines answer only the router."""
    prefill: RoleSpec = Field(default_factory=RoleSpec)
    """The prefill fleet."""
    decode: RoleSpec = Field(default_factory=RoleSpec)
    """The decode fleet."""
    kv_transfer: KvTransferSpec = Field(default_factory=KvTransferSpec)
    """KV transfer between the roles (NixlConnector)."""
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    """Node placement."""
    router: RouterSpec = Field(default_factory=RouterSpec)
    """The KV-cache-aware router."""
    network: NetworkSpec = Field(default_factory=NetworkSpec)
    """Extra peers of the rendered NetworkPolicies: the router's clients, metrics scrapers,
    the operator, the model download."""
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec)
    """Metrics scraping."""

    @model_validator(mode="after")
    def _cross_field_rules(self) -> DisaggregatedInferenceSpec:
        check_document(self.model_dump(by_alias=True, exclude_none=True, mode="json"))  # the CRD's CEL rules
        return self

    def role(self, name: Literal["prefill", "decode"]) -> RoleSpec:
        return self.prefill if name == "prefill" else self.decode

    def prefix_caching(self, name: Literal["prefill", "decode"]) -> bool:
        explicit = self.role(name).prefix_caching
        if explicit is not None:
            return explicit
        return not (self.profile == "benchmark" and name == "prefill")

    def gpus(self, name: Literal["prefill", "decode"]) -> int:
        role = self.role(name)
        if role.resources.gpus is not None:
            return role.resources.gpus
        return role.tensor_parallel_size if self.placement.gpus > 0 else 0

    def efa_devices(self, name: Literal["prefill", "decode"]) -> int:
        role = self.role(name)
        if role.resources.efa_devices is not None:
            return role.resources.efa_devices
        node_gpus, node_efa, gpus = self.placement.gpus, self.placement.efa_devices, self.gpus(name)
        if node_gpus == 0 or node_efa == 0 or gpus == 0:  # an engine without GPUs moves no KV over EFA
            return 0
        return max(1, node_efa * gpus // node_gpus)

    @property
    def backends(self) -> list[str]:
        if self.kv_transfer.backends is not None:
            return list(self.kv_transfer.backends)
        return ["LIBFABRIC"] if self.placement.efa_devices > 0 else ["UCX"]

    @property
    def kv_buffer_device(self) -> str:
        if self.kv_transfer.kv_buffer_device is not None:
            return self.kv_transfer.kv_buffer_device
        return "cuda" if self.placement.gpus > 0 else "cpu"

    @property
    def block_size(self) -> int | None:
        if self.kv_transfer.block_size is not None:
            return self.kv_transfer.block_size
        return GPU_BLOCK_SIZE if self.kv_buffer_device == "cuda" else None

    @property
    def decode_local_max_tokens(self) -> int:
        if self.router.decode_local_max_tokens is not None:
            return self.router.decode_local_max_tokens
        return GPU_DECODE_LOCAL_MAX_TOKENS if self.kv_buffer_device == "cuda" else 0

    @property
    def decode_local_idle_max_tokens(self) -> int:
        if self.router.decode_local_idle_max_tokens is not None:
            return self.router.decode_local_idle_max_tokens
        return GPU_DECODE_LOCAL_IDLE_MAX_TOKENS if self.kv_buffer_device == "cuda" else 0

    @property
    def claim_queue_tokens(self) -> int:
        if self.router.claim_queue_tokens is not None:
            return self.router.claim_queue_tokens
        return GPU_CLAIM_QUEUE_TOKENS if self.kv_buffer_device == "cuda" else CPU_CLAIM_QUEUE_TOKENS

    @property
    def prefill_affinity(self) -> bool:
        if self.router.prefill_affinity is not None:
            return self.router.prefill_affinity
        return self.prefix_caching("prefill")

    @property
    def router_ttl(self) -> int:
        return self.router.effective_ttl(self.kv_transfer.decoder_kv_blocks_ttl_seconds)

    @property
    def uses_efa(self) -> bool:
        return "LIBFABRIC" in self.backends and self.placement.efa_devices > 0


class _Status(_Spec):
    """Base of what the operator writes: tolerant of fields a newer operator added."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="allow", frozen=True, use_attribute_docstrings=True
    )


class Condition(_Status):
    """A status condition (Kubernetes convention)."""

    type: str
    """Condition type."""
    status: Literal["True", "False", "Unknown"]
    """Condition status."""
    reason: str = ""
    """Machine-readable reason."""
    message: str = ""
    """What a person should know or do."""
    last_transition_time: str | None = None
    """When the status last changed (RFC 3339)."""
    observed_generation: int | None = None
    """metadata.generation this condition was computed for."""


class RoleStatus(_Status):
    """Ready versus desired engines of one role."""

    ready: int = 0
    """Ready pods."""
    desired: int = 0
    """Desired pods."""
    updated: int = 0
    """Pods already on the config hash in force."""
    draining: int = 0
    """Decode pods on their way out that still answer: their conversations' next turns read
    the KV they hold and move to another decode (at most the router's entry deadline)."""
    summary: str = "0/0"
    """ready/desired, for printer columns."""


class ReuseStatus(_Status):
    """Counters read from the router."""

    hit_rate: float | None = None
    """Share of turns with a stored entry that reused decode's KV."""
    hits: int = 0
    """Turns that reused decode's KV: read back by prefill (D->P), or prefilled on that decode."""
    expired: int = 0
    """Entries past the router's deadline when the next turn came."""
    released: int = 0
    """Turns whose held KV decode had released under memory pressure (recomputed): above a few
    percent of hits, decode's KV is too small for the conversations live within the TTL; add decode replicas."""
    recommended_ttl_seconds: int | None = None
    """decoderKvBlocksTtlSeconds that would cover the observed inter-turn gaps (p95 + margin); advice only."""
    valve_off: int | None = None
    """Decodes that keep held KV until a read or the TTL under memory pressure: releaseUnderPressure
    false, an engine without pdx's plugin, or a vLLM the plugin could not patch (its log says so)."""
    waited: int | None = None
    """Requests decodes refused KV blocks while they kept held KV, since each engine started."""


class DisaggregatedInferenceStatus(_Status):
    """What the operator observed."""

    observed_generation: int | None = None
    """metadata.generation last reconciled."""
    config_hash: str | None = None
    """Engine config generation in force (pods carry it as label pdx.dev/config-hash)."""
    ready: str | None = None
    """`True` when both roles and the router are available."""
    prefill: RoleStatus | None = None
    """Prefill engines."""
    decode: RoleStatus | None = None
    """Decode engines."""
    router: RoleStatus | None = None
    """Router pods."""
    router_address: str | None = None
    """In-cluster URL of the router."""
    bidirectional: bool | None = None
    """bidirectional_kv_xfer in force."""
    reuse: ReuseStatus | None = None
    """Router reuse counters and TTL advice."""
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Conditions (True means): " + "; ".join(f"{t}: {m}" for t, m in CONDITIONS.items()) + ".",
    )
