"""Per-request records: vLLM's multi-turn `--stats-json-output` fields first, pdx's after.

Tools written for vLLM's `benchmarks/multi_turn/benchmark_serving_multi_turn.py` read a JSON
array of flat objects; a pdx records file is such an array whose objects carry every field
that tool writes (same names, same units) plus pdx's own, so those tools read it unchanged.

Where pdx measures differently, it says so here:
- `input_num_tokens` is the engine's `usage.prompt_tokens` (chat template included); vLLM's
  tool sums tokenizer counts of the message contents (template excluded), so pdx's is larger
  by the template's few tokens per message.
- `output_num_tokens` is `usage.completion_tokens`.
- `kv_transfer_ms` is the time prefill engines spent reading KV back from decode (NIXL's
  `vllm:nixl_xfer_time_seconds` histogram on prefill, which records the transfers it
  initiates). `kv_transfer_source` says how it was attributed: "request" (metrics scraped
  before and after the request; only with concurrency 1), "group" (one scrape around a whole
  prefix-length group, spread evenly over the group's reuse hits), or null (not measured).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

# The fields of vLLM's RequestStats, in its order (vllm 0.33.0 benchmarks/multi_turn).
VLLM_FIELDS: tuple[str, ...] = (
    "ttft_ms",
    "tpot_ms",
    "latency_ms",
    "start_time_ms",
    "input_num_turns",
    "input_num_tokens",
    "output_num_tokens",
    "output_num_chunks",
    "output_num_first_chunk_tokens",
    "approx_cached_percent",
    "conversation_id",
    "client_id",
)

REUSE_OUTCOMES = ("hit", "miss", "expired", "declined", "prefix_mismatch", "below_threshold", "none")


@dataclass
class RequestRecord:
    """One answered request. The first twelve fields mirror vLLM's RequestStats."""

    ttft_ms: float
    tpot_ms: float
    latency_ms: float
    start_time_ms: float
    input_num_turns: int
    input_num_tokens: int
    output_num_tokens: int
    output_num_chunks: int
    output_num_first_chunk_tokens: int
    approx_cached_percent: float
    conversation_id: str
    client_id: int
    # pdx
    turn: int = 1
    leg: str = ""  # "off", "on", or "" for a single run
    prefix_tokens: int = 0  # the sweep point this request belongs to
    suffix_tokens: int | None = None  # and its follow-up turns' new tokens (--suffix-tokens; None: not swept)
    # --suffix-mix: the mix's name; suffix_tokens is then this turn's own draw (None on first turns)
    suffix_mix: str | None = None
    live_conversations: int | None = None  # and how many conversations were live at once (--live; None: not swept)
    prefill_ms: float | None = None  # X-PDX-Prefill-Ms: the router's prefill hop, KV read included
    router_ms: float | None = None  # X-PDX-Router-Ms: the router's own time before the first hop (claims too)
    reuse: str | None = None  # X-PDX-Reuse
    reused_tokens: int = 0  # X-PDX-Reused-Tokens
    kv_transfer_ms: float | None = None
    kv_transfer_bytes: float | None = None
    kv_transfer_source: str | None = None
    http_status: int = 200
    # decode's own time per token after the answer's second chunk: unlike tpot_ms, it leaves out
    # the gap between the first two tokens (with prefill's first token, decode's whole hop lies there)
    steady_tpot_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> RequestRecord:
        """Read pdx records and vLLM's own (whose pdx fields are absent and get defaults)."""
        names = {f.name for f in fields(cls)}
        missing = [k for k in VLLM_FIELDS if k not in obj]
        if missing:
            raise ValueError(f"record lacks {', '.join(missing)}")
        return cls(**{k: v for k, v in obj.items() if k in names})

    @property
    def decode_hop_ms(self) -> float | None:
        """TTFT less the router's time before its first hop and less the prefill hop; None when
        the router reported no prefill hop."""
        if self.prefill_ms is None:
            return None
        return self.ttft_ms - self.prefill_ms - (self.router_ms or 0.0)

    @property
    def prefill_compute_ms(self) -> float | None:
        """Prefill time not spent reading KV: what recomputation (or the suffix) cost."""
        if self.prefill_ms is None:
            return None
        return max(0.0, self.prefill_ms - (self.kv_transfer_ms or 0.0))


def path_of(reuse: str | None) -> str:
    """The way a turn went: prefilled on decode (`local`) or through prefill (every other outcome)."""
    return "local" if reuse == "local" else "prefill"


def write_records(path: Path, records: Iterable[RequestRecord]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([r.to_json() for r in records], indent=2) + "\n")
    return path


def stored(path: Path) -> Path | None:
    """``path``, or where it is gzipped (committed results keep records and streams gzipped,
    docs/results/README.md); None when neither is there."""
    for candidate in (path, path.with_name(path.name + ".gz")):
        if candidate.is_file():
            return candidate
    return None


def stored_files(folder: Path, kind: str) -> list[Path]:
    """Every ``<kind>-<leg>.json`` in ``folder``, plain or gzipped, one per leg, by leg."""
    found = {p.name: p for p in folder.glob(f"{kind}-*.json")}
    for p in folder.glob(f"{kind}-*.json.gz"):
        found.setdefault(p.name.removesuffix(".gz"), p)
    return [found[name] for name in sorted(found)]


def leg_of(path: Path) -> str:
    """The leg a ``records-<leg>.json[.gz]`` file holds, by its name."""
    return path.name.removesuffix(".gz").removesuffix(".json").split("-", 1)[1]


def read_bytes(path: Path) -> bytes:
    """A file's bytes, unzipped where its name ends in .gz."""
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


def read_records(path: Path) -> list[RequestRecord]:
    data = json.loads(read_bytes(path))
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON array of records")
    return [RequestRecord.from_json(o) for o in data]


def spread_group_transfer(records: Sequence[RequestRecord], total_ms: float, total_bytes: float) -> None:
    """Attribute a group's total D->P transfer time evenly to its reuse hits.

    Only a hit makes prefill read from decode, so the other requests get 0; records already
    measured per request are left alone.
    """
    pending = [r for r in records if r.kv_transfer_source is None]
    hits = [r for r in pending if r.reuse == "hit"]
    for r in pending:
        r.kv_transfer_source = "group"
        share = 1.0 / len(hits) if r.reuse == "hit" else 0.0
        r.kv_transfer_ms = total_ms * share
        r.kv_transfer_bytes = total_bytes * share
