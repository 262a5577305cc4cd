"""fastpipe.bench.loader_timing: how the loader suite times a pass with a training step."""

import random

import numpy as np
import pytest

from fastpipe.bench import loader_timing as lt


class Batch(tuple):
    """A batch that says where it came from: the loader's pass, or the steps alone."""


def loader_batches(n, kind="loader"):
    return [Batch((np.zeros(3), kind, i)) for i in range(n)]


def record(seen):
    return lambda b: seen.append(b[1])


@pytest.mark.parametrize("cap", [None, 70])
def test_stepped_pass_alternates_blocks_of_the_pass_with_as_many_steps_alone(cap):
    n, block = random.randint(90, 120), random.randint(5, 40)
    batches = loader_batches(n)
    seen = []
    r = lt.stepped_pass(lambda: iter(batches), cap, Batch((np.zeros(3), "alone", -1)), 0.0, block, busy=True,
                        consume=record(seen))
    timed = n - lt.WARMUP_BATCHES if cap is None else cap
    assert (r.batches, r.samples) == (timed, 3 * timed)
    # warm-up batches are consumed untimed and unstepped; then each block of the pass, then as many alone
    expected = []
    for first in range(0, timed, block):
        k = min(block, timed - first)
        expected += ["loader"] * k + ["alone"] * k
    assert seen == expected
    assert r.seconds > 0 and r.alone_seconds > 0
    assert r.added_pct() == pytest.approx(100 * (r.seconds / r.alone_seconds - 1))


def test_stepped_pass_reads_the_probe_around_the_pass_and_closes_the_iterator():
    batches = loader_batches(50)
    probes, closed = iter([2.5, 4.0]), []

    class It:
        def __init__(self):
            self.inner = iter(batches)

        def __iter__(self):
            return self

        def __next__(self):
            return next(self.inner)

        def close(self):
            closed.append(True)

    r = lt.stepped_pass(It, None, batches[0], 0.0, 16, probe=lambda: next(probes))
    assert r.probed == 1.5 and closed == [True]
    assert r.batches == 50 - lt.WARMUP_BATCHES


def test_block_steps_spans_the_block_time_and_a_minimum_count():
    assert lt.block_steps(1.0) == lt.MIN_BLOCK_STEPS
    assert lt.block_steps(lt.BLOCK_SECONDS / 1000) == 1000
    assert lt.block_steps(0.0) >= lt.MIN_BLOCK_STEPS
