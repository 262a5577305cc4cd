"""load_state_dict with another world size (torchrun restarting on fewer or more nodes): the rest of the
epoch split over the new ranks, every unread sample read, none read before read again.

The reference is the definition, written here with numpy: the epoch's order is a permutation seeded by
(seed, epoch); the saved ranks read its first world * batches * batch_size positions."""

import json

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(120)

N, B, SEED = 997, 8, 13  # a prime: no world size divides it


@pytest.fixture
def setup(dataset_factory):
    ds, arrays, _ = dataset_factory(N, {"x": ("uint8", (5,)), "y": ("float32", (2,))})
    return ds, arrays


def run_ranks(fp, ds, arrays, world, state=None, batches=None, **kw):
    """Every rank of a world: loaded with `state`, then `batches` batches (or the pass's rest) each.
    Returns (the indices each rank read, rank 0's state after)."""
    read, after = [], None
    for rank in range(world):
        ld = fp.loader(ds, B, shuffle=True, seed=SEED, rank=rank, world_size=world, **kw)
        if state is not None:
            ld.load_state_dict(json.loads(json.dumps(state)))
        it = iter(ld)
        got = fp.take(it, batches) if batches is not None else fp.epoch(it)
        read.append(np.array(fp.verify(got, arrays), dtype=np.int64))
        if rank == 0:
            after = ld.state_dict()
        ld.close()
    return read, after


@pytest.mark.parametrize("old, new", [(2, 3), (3, 2), (4, 1), (1, 4)])
@pytest.mark.parametrize("remainder, drop_last", [("pad", False), ("drop", True), ("drop", False)])
def test_another_world_reads_the_rest_of_the_epoch(fp, setup, old, new, remainder, drop_last):
    ds, arrays = setup
    kw = dict(shard_remainder=remainder, drop_last=drop_last)
    k = 5
    before, state = run_ranks(fp, ds, arrays, old, batches=k, **kw)
    order = np.random.default_rng([SEED, 0]).permutation(N)
    consumed = order[:old * k * B]
    assert sorted(np.concatenate(before).tolist()) == sorted(consumed.tolist())
    after, _ = run_ranks(fp, ds, arrays, new, state=state, **kw)
    rest = order[old * k * B:]
    assert len({len(r) for r in after}) == 1, "every rank reads as many samples (unequal counts hang DDP)"
    resumed = np.concatenate(after)
    assert not np.isin(resumed, consumed).any(), "a sample read before the restart was read again"
    assert np.isin(resumed, rest).all()
    per_rank = len(rest) // new if remainder == "drop" else -(-len(rest) // new)
    if drop_last:
        per_rank -= per_rank % B
    assert len(after[0]) == per_rank
    if remainder == "pad" and not drop_last:  # every unread sample, the pad's few twice
        assert set(resumed.tolist()) == set(rest.tolist()) and len(resumed) - len(rest) < new
    else:  # each at most once
        assert len(set(resumed.tolist())) == len(resumed)
    # Rank r of the new world reads positions r, r + new, ... of the rest: the order is kept.
    for r in range(new):
        np.testing.assert_array_equal(after[r], np.resize(rest, new * per_rank)[r::new][:len(after[r])]
                                      if remainder == "pad" else rest[:new * per_rank][r::new])


def test_a_chain_of_restarts_reads_every_sample_once(fp, setup):
    """2 ranks, then 3 from the middle of the epoch, then 2 again from the middle of the resumed pass: with
    "drop" nothing is read twice, and what no pass reads is less than a round per pass; the next epoch
    is whole."""
    ds, arrays = setup
    kw = dict(shard_remainder="drop")
    first, state = run_ranks(fp, ds, arrays, 2, batches=7, **kw)
    assert state["offset"] == 0 and state["batch"] == 7
    second, state = run_ranks(fp, ds, arrays, 3, state=state, batches=4, **kw)
    assert state["world_size"] == 3 and state["offset"] == 2 * 7 * B and state["batch"] == 4
    third, state = run_ranks(fp, ds, arrays, 2, state=state, **kw)
    seen = np.concatenate(first + second + third)
    assert len(set(seen.tolist())) == len(seen), "a sample was read twice in one epoch"
    assert N - len(seen) < 2 + 3  # the 'drop' remainders of the passes only
    assert state["epoch"] == 1 and state["batch"] == 0 and state["offset"] == 0
    # The next epoch on 2 ranks is a whole epoch, as a loader that never restarted reads it.
    whole, _ = run_ranks(fp, ds, arrays, 2, state=state, **kw)
    fresh = []
    for rank in range(2):
        ld = fp.loader(ds, B, shuffle=True, seed=SEED, rank=rank, world_size=2, **kw)
        ld.set_epoch(1)
        fresh.append(np.array(fp.verify(fp.epoch(ld), arrays)))
    for a, b in zip(whole, fresh):
        np.testing.assert_array_equal(a, b)


def test_the_same_world_after_a_restart_resumes_exactly(fp, setup):
    """A pass resumed with another world size is itself resumed exactly by its own world size."""
    ds, arrays = setup
    _, state = run_ranks(fp, ds, arrays, 3, batches=6)
    straight, _ = run_ranks(fp, ds, arrays, 2, state=state)
    _, mid = run_ranks(fp, ds, arrays, 2, state=state, batches=9)
    assert mid["offset"] == 3 * 6 * B and mid["batch"] == 9
    rest, _ = run_ranks(fp, ds, arrays, 2, state=mid)
    for s, r in zip(straight, rest):
        np.testing.assert_array_equal(s[9 * B:], r)


def test_a_state_at_the_end_of_an_epoch_starts_the_next(fp, setup):
    ds, arrays = setup
    saved = fp.loader(ds, B, shuffle=True, seed=SEED, rank=0, world_size=3)
    fp.epoch(saved)
    state = saved.state_dict()
    assert (state["epoch"], state["batch"]) == (1, 0)
    state["epoch"], state["batch"] = 0, len(saved)  # the same position, written as the epoch's end
    ld = fp.loader(ds, B, shuffle=True, seed=SEED, rank=1, world_size=2)
    ld.load_state_dict(state)
    assert (ld.state_dict()["epoch"], ld.state_dict()["batch"], ld.state_dict()["offset"]) == (1, 0, 0)
    fresh = fp.loader(ds, B, shuffle=True, seed=SEED, rank=1, world_size=2)
    fresh.set_epoch(1)
    assert fp.same_batches(fp.epoch(ld), fp.epoch(fresh))


def test_len_of_a_resumed_pass_counts_its_batches(fp, setup):
    ds, arrays = setup
    _, state = run_ranks(fp, ds, arrays, 4, batches=10)
    ld = fp.loader(ds, B, shuffle=True, seed=SEED, rank=0, world_size=2)
    ld.load_state_dict(state)
    it = iter(ld)
    n = len(it)
    assert n == -(-(-(-(N - 4 * 10 * B) // 2)) // B)
    assert len(fp.epoch(it)) == n


def test_a_sampler_keeps_its_world(fp, setup):
    ds, _ = setup

    class Order:
        def __iter__(self):
            return iter(range(0, N, 2))

        def __len__(self):
            return -(-N // 2)

    saved = fp.loader(ds, B, sampler=Order(), world_size=2, rank=0)
    fp.take(iter(saved), 3)
    ld = fp.loader(ds, B, sampler=Order(), world_size=3, rank=0)
    with pytest.raises(ValueError, match="saved with world_size=2 .* its sampler decides the order"):
        ld.load_state_dict(saved.state_dict())
