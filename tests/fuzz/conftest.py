"""The router tests' fixtures (fake engines, a router before them), for the framing checks
and the malformed-answer fuzzing that run the whole router."""

from __future__ import annotations

from tests.router.conftest import http, make_stack  # noqa: F401  (fixtures)
