"""Synthetic records for report tests: known TTFTs so the table can be checked by hand."""

from __future__ import annotations

from pdx_bench.records import RequestRecord


def record(
    leg: str,
    prefix: int,
    turn: int,
    ttft: float,
    *,
    conv: str = "c0",
    prompt: int = 0,
    prefill: float | None = None,
    xfer: float | None = None,
    reuse: str | None = None,
) -> RequestRecord:
    return RequestRecord(
        ttft_ms=ttft,
        tpot_ms=5.0,
        latency_ms=ttft + 100,
        start_time_ms=0.0,
        input_num_turns=2 * turn,
        input_num_tokens=prompt or prefix + 300 * turn,
        output_num_tokens=32,
        output_num_chunks=31,
        output_num_first_chunk_tokens=1,
        approx_cached_percent=90.0,
        conversation_id=f"{leg}-{conv}",
        client_id=0,
        turn=turn,
        leg=leg,
        prefix_tokens=prefix,
        prefill_ms=prefill,
        reuse=reuse,
        kv_transfer_ms=xfer,
    )


def sweep_records() -> list[RequestRecord]:
    """Two lengths; OFF slow, ON fast with 3 of 4 follow-up turns hits, the bound faster still
    (no router headers: it went straight to decode); turn 1 is an outlier."""
    out: list[RequestRecord] = []
    for prefix, off_ttfts, on_ttfts, bound_ttfts in (
        (1000, [100, 110, 120, 130], [50, 60, 70, 80], [30, 40, 50, 60]),
        (4000, [400, 500, 600, 700], [100, 100, 200, 300], [50, 50, 100, 100]),
    ):
        out.append(record("off", prefix, 1, 9999, reuse="miss", prefill=9000))
        out.append(record("on", prefix, 1, 9999, reuse="miss", prefill=9000))
        out.append(record("bound", prefix, 1, 9999))
        out += [record("bound", prefix, 2 + i, t) for i, t in enumerate(bound_ttfts)]
        for i, t in enumerate(off_ttfts):
            out.append(record("off", prefix, 2 + i, t, reuse="miss", prefill=t - 10, xfer=0.0))
        for i, t in enumerate(on_ttfts):
            hit = i < 3
            out.append(
                record("on", prefix, 2 + i, t, reuse="hit" if hit else "miss", prefill=t - 10, xfer=5.0 if hit else 0.0)
            )
    return out
