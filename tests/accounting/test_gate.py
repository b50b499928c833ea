"""Which held pods a gating budget lets go: a prefix of the queue (oldest first), as long as it fits, and the
level the consumption must fall to for the head of the queue, checked against the rule written out here."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops.accounting.errors import NegativeValueError
from gpuops.accounting.gate import HeldPod, queue, releasable, release_level, reserve
from gpuops.accounting.gpuhours import MICROS_PER_HOUR

F = Fraction
HOUR = MICROS_PER_HOUR

AMOUNTS = st.fractions(min_value=0, max_value=50, max_denominator=12)
RATES = st.sampled_from([F(0), F(1), F(7, 3), F(4)])
HORIZONS = st.sampled_from([0, 1, HOUR // 60, HOUR, 3 * HOUR])


@st.composite
def held_pods(draw: st.DrawFn) -> list[HeldPod]:
    n = draw(st.integers(0, 8))
    created = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))  # ties on purpose
    gpus = draw(st.lists(st.sampled_from([F(1, 7), F(1, 2), F(1), F(2), F(8)]), min_size=n, max_size=n))
    return [HeldPod(f"ns/p{i}", c, g) for i, (c, g) in enumerate(zip(created, gpus, strict=True))]


def fits(prefix: list[HeldPod], remaining: Fraction, running: Fraction, rate: Fraction, horizon: int) -> bool:
    """The rule from its definition: the reserve of the running pods and the whole prefix within what is left."""
    total = running + sum((p.gpus for p in prefix), F(0))
    return remaining > 0 and total * rate * horizon / HOUR <= remaining


@settings(max_examples=400, deadline=None)
@given(held=held_pods(), remaining=st.fractions(min_value=-5, max_value=50, max_denominator=12),
       running=AMOUNTS, rate=RATES, horizon=HORIZONS)
def test_the_released_pods_are_the_longest_prefix_of_the_queue_that_fits(
    held: list[HeldPod], remaining: Fraction, running: Fraction, rate: Fraction, horizon: int,
) -> None:
    order = queue(held)
    assert [(p.created, p.key) for p in order] == sorted((p.created, p.key) for p in held)
    out = releasable(held, remaining=remaining, running_gpus=running, rate=rate, horizon=horizon)
    assert out == order[:len(out)]
    assert not out or fits(out, remaining, running, rate, horizon)
    if len(out) < len(order):  # the next one in line does not fit: the queue stops there
        assert not fits(order[:len(out) + 1], remaining, running, rate, horizon)
    assert releasable(list(reversed(held)), remaining=remaining, running_gpus=running, rate=rate,
                      horizon=horizon) == out


@settings(max_examples=200, deadline=None)
@given(held=held_pods(), a=AMOUNTS, b=AMOUNTS, running=AMOUNTS, rate=RATES, horizon=HORIZONS)
def test_more_quota_left_never_lets_fewer_go(
    held: list[HeldPod], a: Fraction, b: Fraction, running: Fraction, rate: Fraction, horizon: int,
) -> None:
    low, high = sorted((a, b))
    fewer = releasable(held, remaining=low, running_gpus=running, rate=rate, horizon=horizon)
    more = releasable(held, remaining=high, running_gpus=running, rate=rate, horizon=horizon)
    assert more[:len(fewer)] == fewer


@settings(max_examples=200, deadline=None)
@given(held=held_pods(), quota=AMOUNTS, consumed=AMOUNTS, running=AMOUNTS, rate=RATES, horizon=HORIZONS)
def test_the_head_goes_exactly_when_the_consumption_is_at_its_release_level(
    held: list[HeldPod], quota: Fraction, consumed: Fraction, running: Fraction, rate: Fraction, horizon: int,
) -> None:
    order = queue(held)
    if not order:
        return
    head = order[0]
    level = release_level(quota, running_gpus=running, head=head, rate=rate, horizon=horizon)
    goes = bool(releasable(held, remaining=quota - consumed, running_gpus=running, rate=rate, horizon=horizon))
    assert goes == (consumed <= level and consumed < quota)


def test_over_quota_nothing_goes_even_with_no_horizon() -> None:
    pods = [HeldPod("ns/a", 0, F(1))]
    assert releasable(pods, remaining=F(0), running_gpus=F(0), rate=F(1), horizon=0) == []
    assert releasable(pods, remaining=F(1, 10**9), running_gpus=F(0), rate=F(1), horizon=0) == pods


def test_a_large_old_pod_is_not_overtaken() -> None:
    pods = [HeldPod("ns/big", 1, F(8)), HeldPod("ns/small", 2, F(1))]
    # 4 GPU-hours left cover the small pod's hour but not the big one's: neither goes
    assert releasable(pods, remaining=F(4), running_gpus=F(0), rate=F(1), horizon=HOUR) == []
    assert releasable(pods, remaining=F(9), running_gpus=F(0), rate=F(1), horizon=HOUR) == pods


@pytest.mark.parametrize(("gpus", "rate", "horizon"), [(F(-1), F(1), 1), (F(1), F(-1), 1), (F(1), F(1), -1)])
def test_negative_inputs_are_refused(gpus: Fraction, rate: Fraction, horizon: int) -> None:
    with pytest.raises(NegativeValueError):
        reserve(gpus, rate=rate, horizon=horizon)
