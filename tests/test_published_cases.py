"""The planner against published GRPO measurements and layouts (the table and its sources:
tests/published_cases.py). Each check is a band on predicted ÷ published, or one-sided where the source only
tells a direction."""

from __future__ import annotations

import pytest

from .published_cases import CASES


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_planner_agrees_with_the_published_case(case):
    predicted = case.predict()
    assert case.holds(predicted), f"{case.describe(predicted)}; source: {case.source}"


def test_a_check_can_fail():
    """The checks are not vacuous: a prediction far off the published figure fails each bounded side."""
    for case in CASES:
        if case.low is not None:
            assert not case.holds(case.published * case.low * 0.9)
        if case.high is not None:
            assert not case.holds(case.published * case.high * 1.1)
