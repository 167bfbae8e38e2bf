"""The cost model against published GRPO measurements (the table and its sources: tests/published_cases.py)."""

from __future__ import annotations

import pytest

from .published_cases import CASES


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_prediction_within_the_published_band(case):
    ratio = case.predict() / case.published
    low, high = case.band
    assert low <= ratio <= high, f"{case.what}: predicted/published {ratio:.2f} outside {low}–{high} ({case.source})"
