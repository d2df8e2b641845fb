"""The request bounds in router.json and on the command line: defaults, flags, bad values named."""

from __future__ import annotations

import pytest

from pdx_router.config import ConfigError, RouterConfig
from pdx_router.main import build_config, parse_args

ENGINES = ["--prefill", "http://p:8000", "--decode", "http://d:8000"]


def test_the_bounds_have_defaults_a_user_expects() -> None:
    cfg = RouterConfig()
    assert (cfg.header_timeout_seconds, cfg.body_timeout_seconds, cfg.max_connections) == (10.0, 60.0, 4096)
    wire = cfg.to_json()
    assert (wire["headerTimeoutSeconds"], wire["bodyTimeoutSeconds"], wire["maxConnections"]) == (10.0, 60.0, 4096)


def test_flags_set_the_bounds() -> None:
    flags = ["--header-timeout", "2.5", "--body-timeout", "30", "--max-connections", "100"]
    cfg = build_config(parse_args([*ENGINES, *flags]))
    assert (cfg.header_timeout_seconds, cfg.body_timeout_seconds, cfg.max_connections) == (2.5, 30.0, 100)


@pytest.mark.parametrize(
    ("flag", "field"),
    [
        ("--header-timeout", "headerTimeoutSeconds"),
        ("--body-timeout", "bodyTimeoutSeconds"),
        ("--max-connections", "maxConnections"),
    ],
)
def test_a_bound_of_zero_is_refused_naming_the_field(flag: str, field: str) -> None:
    with pytest.raises(ConfigError, match=f"^{field}: "):
        build_config(parse_args([*ENGINES, flag, "0"]))
