"""The committed corpus (tests/fuzz/corpus), replayed through every check: RFC 9112's
examples, the issue's framing checks, the fault suite's malformed engine answers and client
bodies, and the shortest input the fuzzers found for each allowed difference. Every rule of
the allow-lists must be needed by some entry and be written up in docs/fuzzing.md."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import pytest

from . import differ, front_rules, http1_rules, wire_rules
from .checks import check_front, check_http1, check_wire
from .filter_check import check_filter
from .shapes_check import FRONTS, check_shapes

CORPUS = Path(__file__).parent / "corpus"
DOCS = Path(__file__).parents[2] / "docs" / "fuzzing.md"
SPLITS = ((), (1,), (7, 19, 40), tuple(range(3, 4000, 11)))  # whole, and cut in a few ways


def _files(where: str) -> list[Path]:
    return sorted((CORPUS / where).glob("*"))


def _methods(path: Path) -> list[str]:
    """An answer file's requests, named after its '@': `x@GET,POST.http`."""
    return path.stem.partition("@")[2].split(",") if "@" in path.stem else ["POST"]


@pytest.fixture(scope="module")
def hits() -> Counter[str]:
    """The rules the whole corpus needs, counted as it is replayed (module order: last)."""
    differ.HITS.clear()
    return differ.HITS


@pytest.mark.parametrize("path", _files("requests"), ids=lambda p: p.name)
def test_each_request_in_the_corpus_is_framed_as_the_references_frame_it(path: Path, hits: Counter[str]) -> None:
    data = path.read_bytes()
    for cuts in SPLITS:
        check_front(data, cuts)


@pytest.mark.parametrize("path", _files("answers"), ids=lambda p: p.name)
def test_each_answer_in_the_corpus_is_read_as_the_references_read_it(path: Path, hits: Counter[str]) -> None:
    data = path.read_bytes()
    for cuts in SPLITS:
        check_wire(data, cuts)
        check_http1(data, _methods(path), cuts)


@pytest.mark.parametrize("path", _files("streams/valid") + _files("streams/malformed"), ids=lambda p: p.name)
def test_each_stream_in_the_corpus_leaks_nothing_and_a_valid_one_loses_nothing(path: Path) -> None:
    stream, valid = path.read_bytes(), path.parent.name == "valid"
    for cuts in SPLITS:
        for capture, strip_ids in ((True, True), (True, False), (False, True), (False, False)):
            for max_line in (64 << 20, 200):
                check_filter(stream, cuts, capture, strip_ids, max_line, valid)


@pytest.mark.parametrize("path", _files("bodies"), ids=lambda p: p.name)
def test_each_body_in_the_corpus_is_served_or_refused_naming_the_field(path: Path) -> None:
    body = orjson.loads(path.read_bytes())
    for front in FRONTS:
        for is_chat in (True, False):
            check_shapes(body, [("Authorization", "Bearer k")], is_chat, front)


def test_every_allowed_difference_is_needed_by_the_corpus_and_written_up(hits: Counter[str]) -> None:
    """Run last in this module: an allow-list entry no input needs would hide nothing but
    could hide something later; one not in the docs is a difference nobody was told of."""
    rules = [(r.name, r.against) for r in front_rules.RULES]
    rules += [(r[0], r[1]) for r in (*wire_rules.RULES, *http1_rules.RULES)]
    needed = {f"{ref}: {name}" for name, against in rules for ref in against}
    assert needed <= set(hits), f"rules no corpus entry needs: {sorted(needed - set(hits))}"
    docs = DOCS.read_text()
    assert not [name for name, _ in rules if f"`{name}`" not in docs], "rules missing from docs/fuzzing.md"
