"""The throttle's count: atomic in the shared cache, a sliding window over two fixed ones,
refusals not counted, and a wait that lets exactly the next request through."""

from __future__ import annotations

import pytest
from django.core.cache import cache

from kernel.api.throttling import parse_rate, take


@pytest.fixture(autouse=True)
def _empty_cache() -> None:
    cache.clear()


def test_rates_in_drfs_notation() -> None:
    assert parse_rate("10/minute") == (10, 60)
    assert parse_rate("3/s") == (3, 1)
    assert parse_rate("100/day") == (100, 86400)


def test_the_rate_passes_and_no_more_and_a_refusal_costs_nothing() -> None:
    start = 6000.0  # the start of a window of 60 s
    assert [take("s", "x", "3/minute", now=start + i) for i in range(3)] == [None] * 3
    wait = take("s", "x", "3/minute", now=start + 3)
    assert wait is not None and 0 < wait <= 120
    assert take("s", "y", "3/minute", now=start + 3) is None  # another caller: its own count
    # Refused ones are not counted: waiting as told lets exactly one more through.
    for _ in range(5):
        assert take("s", "x", "3/minute", now=start + 3) is not None
    assert take("s", "x", "3/minute", now=start + 3 + wait + 0.01) is None
    assert take("s", "x", "3/minute", now=start + 3 + wait + 0.02) is not None


def test_the_previous_window_still_counts_for_the_part_within_the_period() -> None:
    start = 6000.0
    for i in range(4):
        assert take("s", "x", "4/minute", now=start + 50 + i) is None
    # 15 s into the next window, three quarters of the last one's 4 still weigh: 3.
    assert take("s", "x", "4/minute", now=start + 75) is None
    assert take("s", "x", "4/minute", now=start + 75) is not None
