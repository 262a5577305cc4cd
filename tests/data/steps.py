"""Training steps and a feed of checked batches, for the tests of where a loader reads its batches
(test_loader_gather_auto.py, test_loader_placement.py)."""

import time

import pytest
import torch


def sleeping_step():
    """A step that leaves the cores idle (a GPU step)."""
    time.sleep(0.001)


def busy_step(a=torch.randn(192, 192)):
    """A CPU training step: torch ops on every core for 3 ms."""
    end = time.perf_counter() + 0.003
    while time.perf_counter() < end:
        torch.mm(a, a)


class Feed:
    """Batches from a loader, epoch after epoch, each checked against the arrays written (verify=False:
    a loop that only takes batches)."""

    def __init__(self, fp, ld, arrays):
        self.fp, self.ld, self.arrays, self.it, self.batches = fp, ld, arrays, None, 0

    def take(self, step, verify=True):
        if self.it is None:
            self.it = iter(self.ld)
        b = next(self.it, None)
        if b is None:
            self.it = None
            return self.take(step, verify)
        if verify:
            self.fp.verify([self.fp.to_np(b)], self.arrays)
        del b
        step()
        self.batches += 1
        return self.ld.stats()

    def until(self, step, done, limit, verify=True):
        for _ in range(limit):
            s = self.take(step, verify)
            if done(s):
                return s
        pytest.fail(f"not within {limit} batches: {s}")
