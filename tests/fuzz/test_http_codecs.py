"""The router's HTTP/1.1 codecs and the operator's, each against h11 and llhttp on the same
bytes (checks.py): framing decisions alike, or different as a documented rule allows."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from . import targets
from .draw import HypothesisDraw
from .profiles import fuzz


@fuzz(600)
@given(st.data())
def test_front_frames_requests_as_the_references_do_however_they_are_split(data: st.DataObject) -> None:
    targets.front(HypothesisDraw(data))


@fuzz(600)
@given(st.data())
def test_wire_reads_an_engines_answer_as_the_references_do_however_it_is_split(data: st.DataObject) -> None:
    targets.wire(HypothesisDraw(data))


@fuzz(600)
@given(st.data())
def test_the_operators_connection_reads_answers_in_turn_as_the_references_do(data: st.DataObject) -> None:
    targets.http1(HypothesisDraw(data))
