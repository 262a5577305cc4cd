"""Sample order: a pure function of (seed, epoch), sharded across distributed ranks."""

import numpy as np
import torch

from fastpipe import _checks as checks

REMAINDER_POLICIES = ("pad", "drop")


def epoch_order(num_samples, *, shuffle, seed, epoch):
    """The global sample order of one epoch: a permutation seeded by (seed, epoch), or 0..n-1."""
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    return np.random.default_rng([seed, epoch]).permutation(num_samples).astype(np.int64, copy=False)


def block_order(block_starts, num_samples, *, seed, epoch, window):
    """The global order of one epoch under a block shuffle: the blocks (contiguous runs of samples, a
    WebDataset's shards) in an order permuted by (seed, epoch), taken `window` blocks at a time, and each
    window's samples permuted among themselves. A pure function of (seed, epoch), like epoch_order: a
    reader only ever needs the blocks of one window (two, across a window's end) at once."""
    starts = np.asarray(block_starts, dtype=np.int64)
    ends = np.append(starts[1:], num_samples)
    rng = np.random.default_rng([seed, epoch, 1])  # not epoch_order's stream
    blocks = rng.permutation(len(starts))
    out = []
    for w in range(0, len(blocks), window):
        samples = np.concatenate([np.arange(starts[b], ends[b], dtype=np.int64) for b in blocks[w:w + window]])
        out.append(samples[rng.permutation(len(samples))])
    return np.concatenate(out)


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


def distributed_defaults(rank, world_size):
    """(rank, world_size): as given, else torch.distributed's when it is initialised, else (0, 1)."""
    dist = torch.distributed
    initialised = dist.is_available() and dist.is_initialized()
    if world_size is None:
        world_size = dist.get_world_size() if initialised else 1
    if rank is None:
        rank = dist.get_rank() if initialised else 0
    world_size = checks.integer(world_size, "world_size", low=1)
    rank = checks.integer(rank, "rank", low=0, high=world_size - 1, why=f" (world_size={world_size})")
    return rank, world_size
