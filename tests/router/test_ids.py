"""Token ids as text (pdx_router.ids): every operation agrees with the same one on ints."""

from __future__ import annotations

import random

import orjson
import pytest

from pdx_router import ids
from pdx_router.ids import of_json, of_list


def lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_the_prefix_check_on_text_equals_the_one_on_ints_wherever_the_ids_diverge() -> None:
    rng = random.Random(3)
    for _ in range(3000):
        a = [rng.choice([0, 1, 7, 10, 12, 123, 1234, 99999, 100000]) for _ in range(rng.randrange(0, 12))]
        b = a[: rng.randrange(0, len(a) + 1)] + [rng.choice([0, 1, 10, 12, 120, 1234]) for _ in range(rng.randrange(3))]
        assert ids.common_prefix(of_list(a), of_list(b)) == lcp(a, b), (a, b)
        assert ids.common_prefix(of_list(b), of_list(a)) == lcp(a, b), (a, b)
        n = lcp(a, b)
        assert ids.compare(of_list(a), len(a), of_list(b)) == (n, len(a) > n, len(b) > n), (a, b)


def test_head_count_join_and_ends_with_agree_with_lists() -> None:
    rng = random.Random(5)
    for _ in range(500):
        a = [rng.randrange(200) for _ in range(rng.randrange(0, 30))]
        b = [rng.randrange(200) for _ in range(rng.randrange(0, 5))]
        t = of_list(a)
        assert ids.count(t) == len(a) and ids.to_list(t) == a
        for n in range(len(a) + 2):
            assert ids.head(t, n) == of_list(a[:n])
        assert ids.join(t, of_list(b)) == of_list(a + b)
        assert ids.ends_with(of_list(a + b), of_list(b))
        if b:
            assert ids.ends_with(t, of_list(b)) == (len(a) >= len(b) and a[-len(b) :] == b), (a, b)


def test_any_valid_json_form_of_ids_reads_as_the_same_text() -> None:
    assert of_json(b"[1,2,3]") == of_json(b"[ 1 , 2,3 ]") == of_json(b"[1.0,2e0,3]") == b"1,2,3"
    assert of_json(b"[0,10,0]") == b"0,10,0" and of_json(b"[]") == b""
    big = [random.Random(1).randrange(150_000) for _ in range(5000)]
    assert of_json(orjson.dumps(big)) == of_list(big)


@pytest.mark.parametrize("raw", [b"[01]", b"[1,-2]", b"[true]", b"[1,,2]", b"[1,2,]", b"[1.5]", b'["1"]', b"{}", b"[1"])
def test_what_is_not_a_list_of_token_ids_is_refused(raw: bytes) -> None:
    assert of_json(raw) is None


def test_checking_beside_known_ids_refuses_what_a_whole_check_refuses() -> None:
    known = of_list([5, 60, 700])
    assert ids.of_json_beside(b"[5,60,700,8]", known) == b"5,60,700,8"
    assert ids.of_json_beside(b"[5,60,7000]", known) == b"5,60,7000"
    for bad in (b"[5,60,700,08]", b"[5,60,700,,8]", b"[5,60,700,x]", b"[5,60,07]", b"[5,60,700,]"):
        assert ids.of_json_beside(bad, known) is None, bad


def test_a_list_that_is_not_of_non_negative_ints_has_no_text() -> None:
    for bad in ([1, -1], [True], [1.5], ["1"]):
        with pytest.raises(ValueError):
            of_list(bad)  # type: ignore[arg-type]
