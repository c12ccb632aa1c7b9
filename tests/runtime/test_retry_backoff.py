"""Full-jitter exponential backoff (pure)."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from runtime.transitions.accept_decision import backoff_delay


@given(
    attempts=st.integers(min_value=1, max_value=30),
    base=st.floats(min_value=0.01, max_value=10),
    cap=st.floats(min_value=0.01, max_value=600),
    seed=st.integers(),
)
def test_delay_stays_inside_the_growing_capped_envelope(attempts, base, cap, seed):
    delay = backoff_delay(attempts, base, cap, random.Random(seed))
    assert 0 <= delay <= min(cap, base * 2 ** (attempts - 1))


def test_envelope_doubles_until_the_cap_and_delays_are_jittered():
    rng = random.Random(7)
    samples = {n: [backoff_delay(n, 1.0, 8.0, rng) for _ in range(400)] for n in range(1, 7)}
    maxima = [max(samples[n]) for n in range(1, 7)]
    # The largest observed delay grows with the attempt number (1, 2, 4, 8, then capped at 8).
    assert maxima[0] < maxima[1] < maxima[2] < maxima[3]
    assert maxima[4] <= 8.0 and maxima[5] <= 8.0
    # Jitter: delays for the same attempt are spread out, not one fixed value.
    assert len({round(d, 6) for d in samples[3]}) > 300
