"""A transport that keeps what is written to it: the router's protocols driven without a
socket, byte for byte, in microseconds a message."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closed = False
        self.paused = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.out += data

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        for data in list_of_data:
            self.out += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def pieces(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    """data cut where `cuts` say (positions outside it are ignored): the socket's reads."""
    at = sorted({c for c in cuts if 0 < c < len(data)})
    return [data[a:b] for a, b in zip([0, *at], [*at, len(data)], strict=True)]
