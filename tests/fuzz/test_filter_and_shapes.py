"""The stream filter over decode's events in any JSON form and any split, and the request
shape checks over client bodies of any JSON shape."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from . import targets
from .draw import HypothesisDraw
from .profiles import fuzz


@fuzz(500)
@given(st.data())
def test_the_filter_lets_no_router_field_through_and_keeps_every_event(data: st.DataObject) -> None:
    targets.stream_filter(HypothesisDraw(data))


@fuzz(500)
@given(st.data())
def test_a_body_of_any_shape_is_served_or_refused_naming_the_field(data: st.DataObject) -> None:
    targets.shapes(HypothesisDraw(data))
