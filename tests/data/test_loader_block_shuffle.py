"""shuffle="blocks" on a WebDataset: the shards permuted each epoch and read through a sliding window of
them. Checked against the definition's properties on the keys that come out (which
shard each sample is in, written in the keys), and against a full shuffle's class mix."""

import json

import numpy as np
import pytest

import fastpipe
from fastpipe.data.order import block_order, epoch_order, shard
from fastpipe.transforms import CenterCrop

from jpegs import jpeg_bytes, picture
from tar_files import tar_bytes

pytestmark = pytest.mark.timeout(120)
TRANSFORM = {0: CenterCrop(8, resize=8)}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """14 shards of 5 to 12 samples, each shard one class (written class by class: the worst case); keys
    name the shard."""
    rng = np.random.default_rng(7)
    root = tmp_path_factory.mktemp("shards")
    image = jpeg_bytes(picture(rng, 9, 9))
    sizes = rng.integers(5, 13, 14)
    paths = []
    for k, n in enumerate(sizes):
        members = []
        for j in range(n):
            members += [(f"s{k:02d}_{j:02d}.jpg", image), (f"s{k:02d}_{j:02d}.cls", str(k // 2).encode())]
        path = root / f"shard-{k:02d}.tar"
        path.write_bytes(tar_bytes(members))
        paths.append(str(path))
    return paths


def open_blocks(order, block_of):
    """At each position of `order`, the blocks begun and not yet finished (first <= position <= last)."""
    blocks = block_of[order]
    first = np.full(block_of.max() + 1, len(order))
    last = np.zeros(block_of.max() + 1, dtype=np.int64)
    np.minimum.at(first, blocks, np.arange(len(order)))
    np.maximum.at(last, blocks, np.arange(len(order)))
    change = np.zeros(len(order) + 1, dtype=np.int64)
    np.add.at(change, first, 1)
    np.add.at(change, last + 1, -1)
    return np.cumsum(change)[:-1]


def test_the_order_is_the_definitions(rng):
    counts = rng.integers(1, 30, int(rng.integers(5, 40)))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    n = int(counts.sum())
    block_of = np.repeat(np.arange(len(counts)), counts)
    for window in (1, 3, len(counts), len(counts) + 5):
        order = block_order(starts, n, seed=4, epoch=2, window=window)
        assert sorted(order.tolist()) == list(range(n))  # every sample once
        assert open_blocks(order, block_of).max() <= window  # a reader holds at most `window` blocks
        if window == 1:  # one block at a time: each block's samples together
            assert (np.diff(block_of[order]) != 0).sum() == len(counts) - 1
        np.testing.assert_array_equal(order, block_order(starts, n, seed=4, epoch=2, window=window))
        assert not np.array_equal(order, block_order(starts, n, seed=4, epoch=3, window=window)) or n < 3


def spread_evenly(sequence, groups):
    """Whether, after every element of `sequence` (group ids), every group has had its share of its
    elements within one element: |c_g/B_g - c_h/B_h| <= 1/B_g + 1/B_h for all groups g, h."""
    total = np.bincount(groups)
    seen = np.cumsum(np.eye(len(total))[sequence], axis=0) / total
    return bool(np.all((seen - 1 / total).max(axis=1) <= (seen + 1 / total).min(axis=1) + 1e-12))


def test_each_shards_blocks_are_spread_over_the_epoch(rng):
    """Blocks cut from one shard (a group) are spread evenly through the epoch, so that a window holds
    its share of every shard: the i-th of a group's B blocks lies in the i-th B-th of the permutation
    (seen with a window of one block, where the order is the permutation)."""
    groups = np.repeat(np.arange(8), rng.integers(1, 12, 8))
    sizes = rng.integers(1, 6, len(groups))
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    n = int(sizes.sum())
    block_of = np.repeat(np.arange(len(groups)), sizes)
    for epoch in range(4):
        order = block_order(starts, n, seed=int(rng.integers(1 << 30)), epoch=epoch, window=1, groups=groups)
        sequence = block_of[order][np.flatnonzero(np.diff(block_of[order], prepend=-1))]
        assert sorted(sequence.tolist()) == list(range(len(groups)))  # each block once, whole
        assert spread_evenly(groups[sequence], groups)


def test_the_first_and_last_batches_mix_the_window(rng):
    """The window slides: the epoch's first and last batches mix several blocks (fixed windows of 5
    of 22 blocks end the epoch on a window of 2)."""
    size, blocks, window = 200, 22, 5
    block_of = np.repeat(np.arange(blocks), size)
    for epoch in range(5):
        order = block_order(np.arange(0, size * blocks, size), size * blocks, seed=int(rng.integers(1 << 30)),
                            epoch=epoch, window=window)
        assert open_blocks(order, block_of).max() == window
        for batch in (order[:50], order[-50:]):
            assert len(np.unique(block_of[batch])) >= 3


def test_batches_come_in_the_block_order_and_resume(shards):
    ds = fastpipe.WebDataset(shards)
    window = 3
    starts, shards_of, block_bytes = ds._blocks()
    assert len(starts) == len(shards)  # shards smaller than block_size: a block each
    kw = dict(batch_size=4, shuffle="blocks", shuffle_window=int(window * block_bytes) + 1, seed=11,
              transforms=TRANSFORM)
    ld = fastpipe.Loader(ds, **kw)
    for epoch in range(2):
        want = block_order(starts, len(ds), seed=11, epoch=epoch, window=window, groups=shards_of)
        got = [ds.targets[i] for i in want]
        labels = np.concatenate([y.numpy().copy() for _, y in ld])
        np.testing.assert_array_equal(labels, got)
    assert ld.state_dict()["shuffle"] == "blocks" and ld.state_dict()["shuffle_window"] == window
    # Resume mid-epoch, with the same world and with another: the rest of the block order.
    order = block_order(starts, len(ds), seed=11, epoch=0, window=window, groups=shards_of)
    a = fastpipe.Loader(ds, **kw, rank=0, world_size=2)
    it = iter(a)
    [next(it) for _ in range(3)]
    state = json.loads(json.dumps(a.state_dict()))
    rest = []
    for r in range(3):
        b = fastpipe.Loader(ds, **kw, rank=r, world_size=3)
        b.load_state_dict(state)
        rest.append(np.concatenate([y.numpy().copy() for _, y in b]))
    expected = [np.array(ds.targets)[shard(order[2 * 3 * 4:], rank=r, world_size=3, remainder="pad")] for r in range(3)]
    for got, want in zip(rest, expected):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="shuffle_window"):
        fastpipe.Loader(ds, **{**kw, "shuffle_window": int(5 * block_bytes)}).load_state_dict(state)
    with pytest.raises(ValueError, match=f"saved with blocks={len(starts)} but this loader has blocks={len(ds)}"):
        fastpipe.Loader(fastpipe.WebDataset(shards, block_size=1), **kw).load_state_dict(state)


def test_a_window_of_every_shard_mixes_classes_as_a_full_shuffle(shards):
    """Class-by-class shards: batches of a window over every shard hold as many classes as a full
    shuffle's; a window of one shard, one class a batch (what the window buys)."""
    ds = fastpipe.WebDataset(shards)

    def distinct(**kw):
        ld = fastpipe.Loader(ds, batch_size=8, drop_last=True, seed=3, transforms=TRANSFORM, **kw)
        return np.mean([len(set(y.tolist())) for e in range(4) for _, y in (ld.set_epoch(e) or ld)])

    full, everything, one = distinct(shuffle=True), distinct(shuffle="blocks", shuffle_window="1TB"), \
        distinct(shuffle="blocks", shuffle_window=1)
    print(f"distinct classes a batch: full {full:.2f}, window of all shards {everything:.2f}, of one {one:.2f}")
    assert everything >= 0.9 * full and one < 0.6 * full


def test_blocks_need_shards(dataset_factory, shards):
    ds, _, _ = dataset_factory(10, {"x": ("uint8", (3,))})
    with pytest.raises(ValueError, match="shuffle='blocks' shuffles the shards of a sharded dataset"):
        fastpipe.Loader(ds, 2, shuffle="blocks")
    with pytest.raises(TypeError, match="shuffle must be True or False"):
        fastpipe.Loader(ds, 2, shuffle="block")
    with pytest.raises(ValueError, match="shuffle_window must be bytes"):
        fastpipe.Loader(fastpipe.WebDataset(shards), 2, shuffle="blocks", shuffle_window="big", transforms=TRANSFORM)
    assert epoch_order(5, shuffle=False, seed=0, epoch=0).tolist() == [0, 1, 2, 3, 4]
