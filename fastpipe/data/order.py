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


def block_order(block_starts, num_samples, *, seed, epoch, window, groups=None):
    """The global order of one epoch under a block shuffle over a sliding window of `window` blocks
    (contiguous runs of samples: a WebDataset's shards, or pieces of them). A pure function of
    (seed, epoch), like epoch_order.

    The permutation spreads each group's blocks (`groups[b]`: the shard block b is cut from; default:
    every block its own group) evenly over the epoch: the i-th of a group's B blocks, in an order drawn
    at random, takes a key in [i/B, (i+1)/B) from the group's random phase, and the blocks go in key
    order. A window then holds about its share of every shard at any time: with shards written class by
    class, classes keep their proportions through the epoch instead of drifting with a random draw of
    blocks (a model trained at a constant rate follows the latest batches' proportions).

    Block j of the permutation is spread at random over the slots [max(0, j - K + 1), min(j + 1, N - K
    + 1)) of N - K + 1 slots (N blocks, K = min(window, N)), so every slot mixes exactly K blocks and
    block j ends before block j + K begins: a reader never holds more than K blocks at once. Fixed windows
    (K blocks, their samples permuted, then the next K) need the same K blocks but give every window's
    first and last batches fewer blocks and let the epoch end on a short remainder window
    (benchmarks/shuffle_quality.py). Here only the first and the last slots lean on one block: blocks
    that are open for fewer slots there put more samples in each. K >= N is a full shuffle.
    """
    starts = np.asarray(block_starts, dtype=np.int64)
    sizes = np.append(starts[1:], num_samples) - starts
    n_blocks = len(starts)
    groups = np.arange(n_blocks) if groups is None else np.asarray(groups, dtype=np.int64)
    k = max(1, min(int(window), n_blocks))
    rng = np.random.default_rng([seed, epoch, 1])  # not epoch_order's stream
    _, groups, counts = np.unique(groups, return_inverse=True, return_counts=True)
    by_group = np.lexsort((rng.random(n_blocks), groups))  # each group's blocks, in a random order
    place = np.empty(n_blocks)
    place[by_group] = np.arange(n_blocks) - np.repeat(np.cumsum(counts) - counts, counts)
    keys = (place + rng.random(len(counts))[groups]) / counts[groups]
    blocks = np.lexsort((rng.random(n_blocks), keys))
    j = np.arange(n_blocks, dtype=np.float64)
    first = np.maximum(0.0, j - k + 1)
    span = np.minimum(j + 1, n_blocks - k + 1) - first
    sizes = sizes[blocks]
    samples = np.repeat(starts[blocks] - np.cumsum(sizes) + sizes, sizes) + np.arange(num_samples, dtype=np.int64)
    keys = np.repeat(first, sizes) + rng.random(num_samples) * np.repeat(span, sizes)
    # Stable: a key equal to a slot boundary (rounding) keeps block j's samples before block j + K's.
    return samples[np.argsort(keys, kind="stable")]


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
