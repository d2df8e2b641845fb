"""Reading the environment knobs of pdx's vLLM plugins (one parser, one error wording)."""

from __future__ import annotations

import os
from collections.abc import Mapping


def positive_int(name: str, unit: str, environ: Mapping[str, str] = os.environ) -> int | None:
    """``name`` as a whole number >= 1, None when unset or blank.

    A bad value raises ValueError naming the variable and the fix, so the engine fails at start
    instead of running with a setting nobody asked for.
    """
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{name}={raw!r}: expected a whole number of {unit} >= 1, or unset it")
    return int(raw)


def switch(name: str, default: bool, expected: str, environ: Mapping[str, str] = os.environ) -> bool:
    """``name`` as 1 (on) or 0 (off), ``default`` when unset or blank. Anything else raises
    ValueError: ``{name}={raw!r}: expected {expected}, or unset it``."""
    raw = environ.get(name, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"{name}={raw!r}: expected {expected}, or unset it")
    return default if not raw else raw == "1"
