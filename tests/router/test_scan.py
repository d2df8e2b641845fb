"""The stream filter's one search per block: scan.c and its `.py` twin set the same marks."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import random
from types import ModuleType

import pytest

from pdx_router import native, scan

REQUIRED = os.environ.get("PDX_REQUIRE_NATIVE") == "1"  # scripts/test.sh: a missing build fails


def _built() -> ModuleType:
    """The C build, loaded from _native/ whatever this interpreter's pdx_router runs."""
    if native.state(env={}) != "compiled":
        if REQUIRED:
            pytest.fail(f"the data path is not built: {native.state(env={})}")
        pytest.skip("the data path is not built here")
    [path] = native.NATIVE_DIR.glob("scan.*.so")
    spec = importlib.util.spec_from_file_location("pdx_router.scan", path)
    assert spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.__file__ is not None and module.__file__.endswith(".so")
    return module


# Blocks made of the pieces that matter, so every mark (and its near misses) turns up often.
PIECES = [b"kv_transfer_params", b"token_ids", b"\\", b"\r", b"\n", b"data: {", b"x", b"kv_", b"_ids", b"token_id"]


def test_the_c_build_marks_every_block_as_the_python_twin_does() -> None:
    built, rng = _built(), random.Random(19)
    blocks = [b"".join(rng.choices(PIECES, k=rng.randrange(13))) for _ in range(5000)]
    blocks += [rng.randbytes(rng.randrange(65)) for _ in range(2000)]
    seen = set()
    for block in blocks:
        assert built.marks(block) == scan.marks(block), block
        seen.add(scan.marks(block))
    assert len(seen) == 32  # every combination of the five marks came up


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        (b'data: {"text":"hi"}\n\n', 0),
        (b'data: {"kv_transfer_params":null}\n\n', scan.KV),
        (b'data: {"kv\\u005ftransfer_params":null}\n\n', scan.BACKSLASH),
        (b'data: {"token_ids":[1]}\n\n', scan.IDS),
        (b"data: {}\r\n\r\n", scan.CR | scan.LINES),
        (b"data: {}\ndata: {}\n\n", scan.LINES),
        (b"\n\n", 0),  # the first line feed is one of the last two bytes
    ],
)
def test_each_mark_is_set_by_what_it_names_and_nothing_else(block: bytes, expected: int) -> None:
    assert scan.marks(block) == expected
    assert _built().marks(block) == expected


def test_the_c_build_refuses_what_is_not_bytes() -> None:
    with pytest.raises(TypeError, match="marks\\(\\) takes bytes, not str"):
        _built().marks("kv_transfer_params")
