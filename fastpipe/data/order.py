"""Sample order: a pure function of (seed, epoch), sharded across distributed ranks."""

import numpy as np

REMAINDER_POLICIES = ("pad", "drop")


def epoch_order(num_samples, *, shuffle, seed, epoch):
    """The global sample order of one epoch: a permutation seeded by (seed, epoch), or 0..n-1."""
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    return np.random.default_rng([seed, epoch]).permutation(num_samples).astype(np.int64, copy=False)


def shard(order, *, rank, world_size, remainder):
    """The part of `order` that `rank` reads.

    Every rank gets the same number of samples, so every rank runs the same number of steps (unequal
    counts hang DDP). "pad" repeats samples from the start of the order to fill the last round (like
    DistributedSampler: every sample at least once, a few twice); "drop" drops the incomplete last
    round (every sample at most once). Rank r takes positions r, r + world_size, ...
    """
    if world_size == 1:
        return order
    n = len(order)
    if remainder == "drop":
        order = order[: n - n % world_size]
    elif n % world_size:
        order = np.resize(order, n + world_size - n % world_size)  # np.resize repeats from the start
    return order[rank::world_size]


def shard_size(num_samples, *, world_size, remainder):
    if remainder == "drop":
        return num_samples // world_size
    return -(-num_samples // world_size)
