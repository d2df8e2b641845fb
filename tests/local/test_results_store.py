"""Committed results stay small: every GPU call carries the checkout beside a wheelhouse part
within 64 MiB (docs/gpu.md), so records, background streams and engine logs are kept gzipped."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BULKY = re.compile(r"(^|[-/])(records|background)[^/]*\.json$|\.(log|out)$")
LIMIT = 16 * 1024


def test_committed_records_streams_and_logs_above_16_kib_are_gzipped() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "docs/results"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    assert tracked, "docs/results holds committed results"
    plain = [f for f in tracked if BULKY.search(f) and (ROOT / f).stat().st_size > LIMIT]
    assert plain == [], f"gzip these (gzip -9 -n FILE; git add FILE.gz): {plain}"
