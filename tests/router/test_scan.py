"""The stream filter's one search per block: scan.c and its `.py` twin set the same marks."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import random
from pathlib import Path
from types import ModuleType

import pytest

from pdx_router import native

REQUIRED = os.environ.get("PDX_REQUIRE_NATIVE") == "1"  # scripts/test.sh: a missing build fails


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("pdx_router.scan", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _built() -> ModuleType:
    """The C build, loaded from _native/ whatever this interpreter's pdx_router runs."""
    if native.state(env={}) != "compiled":
        if REQUIRED:
            pytest.fail(f"the data path is not built: {native.state(env={})}")
        pytest.skip("the data path is not built here")
    [path] = native.NATIVE_DIR.glob("scan.*.so")
    module = _load(path)
    assert isinstance(module.__loader__, importlib.machinery.ExtensionFileLoader)
    return module


# The `.py` twin from its file: where the build runs, `pdx_router.scan` is the C module itself.
twin = _load(native.HERE / "scan.py")


# Blocks made of the pieces that matter, so every mark (and its near misses) turns up often.
PIECES = [b"kv_transfer_params", b"token_ids", b"\\", b"\r", b"\n", b"data: {", b"x", b"kv_", b"_ids", b"token_id"]


def test_the_c_build_marks_every_block_as_the_python_twin_does() -> None:
    built, rng = _built(), random.Random(19)
    blocks = [b"".join(rng.choices(PIECES, k=rng.randrange(13))) for _ in range(5000)]
    blocks += [rng.randbytes(rng.randrange(65)) for _ in range(2000)]
    seen = set()
    for block in blocks:
        assert built.marks(block) == twin.marks(block), block
        seen.add(twin.marks(block))
    assert len(seen) == 32  # every combination of the five marks came up


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        (b'data: {"text":"hi"}\n\n', 0),
        (b'data: {"kv_transfer_params":null}\n\n', twin.KV),
        (b'data: {"kv\\u005ftransfer_params":null}\n\n', twin.BACKSLASH),
        (b'data: {"token_ids":[1]}\n\n', twin.IDS),
        (b"data: {}\r\n\r\n", twin.CR | twin.LINES),
        (b"data: {}\ndata: {}\n\n", twin.LINES),
        (b"\n\n", 0),  # the first line feed is one of the last two bytes
    ],
)
def test_each_mark_is_set_by_what_it_names_and_nothing_else(block: bytes, expected: int) -> None:
    assert twin.marks(block) == expected
    built = _built()
    assert built.marks(block) == expected
    # The C module's own constants are the twin's (filters reads them from whichever runs).
    names = ("KV", "BACKSLASH", "IDS", "CR", "LINES")
    assert [getattr(built, n) for n in names] == [getattr(twin, n) for n in names]


def test_the_c_build_refuses_what_is_not_bytes() -> None:
    with pytest.raises(TypeError, match="marks\\(\\) takes bytes, not str"):
        _built().marks("kv_transfer_params")
