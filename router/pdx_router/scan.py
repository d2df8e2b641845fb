"""What a relayed block holds that the stream filter must look at, in one call per block.

`marks(block)` sets a bit for each thing the filter's fast path has to rule out: the
`kv_transfer_params` name, a backslash (a JSON escape can spell any name), the `token_ids`
name, a CR, and a line feed before the block's last two bytes (more than one line). The
build (scripts/build_router_native.py) compiles `scan.c`, which does the same with
`memchr`/`memmem` in one C call; like the mypyc modules, it shadows this file while the
build is current. Why C: in CPython 3.11 every `bytes.find` packs its arguments into a tuple
and parses them, and the filter's two to five per block cost more than the rest of it.
"""

from __future__ import annotations

from typing import Final

KV: Final = 1  # b"kv_transfer_params"
BACKSLASH: Final = 2
IDS: Final = 4  # b"token_ids"
CR: Final = 8
LINES: Final = 16  # a b"\n" before the last two bytes


def marks(block: bytes) -> int:
    """The bits above that `block` sets (the C build's twin; tests/router/test_scan.py)."""
    return (
        (KV if block.find(b"kv_transfer_params") >= 0 else 0)
        | (BACKSLASH if block.find(b"\\") >= 0 else 0)
        | (IDS if block.find(b"token_ids") >= 0 else 0)
        | (CR if block.find(b"\r") >= 0 else 0)
        | (LINES if 0 <= block.find(b"\n") < len(block) - 2 else 0)
    )
