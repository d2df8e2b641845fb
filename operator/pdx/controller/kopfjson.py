"""kopf's watch of the DisaggregatedInferences, parsed with orjson.

kopf parses every line of its watch streams with the standard library's `json`
(`kopf._cogs.clients.api`, its one use of the module there) and has no setting for it. On the
real API server a CR event is ~6 KB (the CRD's defaults, managedFields), and that parse was
about a twentieth of the operator's CPU while resources converged (py-spy, 500 resources,
issue 42); orjson parses the same line several times faster and answers the same objects for
anything an API server sends (Go encodes int64 and float64 only). `install` gives that module a
copy of `json` whose `loads` is orjson's, and the standard one for what orjson refuses, so an
error is still json's.
"""

from __future__ import annotations

import json
import types
from typing import Any

import orjson

__all__ = ["install", "loads"]


def loads(text: str | bytes, **kwargs: Any) -> Any:
    """json.loads, through orjson where no keyword changes the parse."""
    if not kwargs:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass  # json's own error (and json's answer where it accepts what orjson does not: NaN)
    return json.loads(text, **kwargs)


def install() -> bool:
    """Point kopf's API module at the faster parse; False where this kopf has no such module."""
    try:
        from kopf._cogs.clients import api
    except ImportError:
        return False
    current = getattr(api, "json", None)
    if not isinstance(current, types.ModuleType):
        return False
    if current.loads is not loads:
        shim = types.ModuleType("json", current.__doc__)
        shim.__dict__.update({k: v for k, v in vars(current).items() if not k.startswith("__")})
        shim.loads = loads  # type: ignore[attr-defined]
        api.json = shim  # type: ignore[attr-defined]
    return True
