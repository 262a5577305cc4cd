"""A remote WebDataset larger than its cache streams in blocks (byte ranges of whole samples, block_size
each) rather than whole shards: the batches are those of the same shards on local disk in the same block
order, the cache never holds more than its limit, each epoch fetches each block at most once (the images'
bytes, not the shards'), the window mixes blocks of more shards than the cache could hold whole, and a
transfer cut short inside a block resumes at its byte. Served by tests/data/servers.py on 127.0.0.1."""

import io
import os
import tarfile
import time

import numpy as np
import pytest

import fastpipe
from fastpipe._ext import _C
from fastpipe.data.order import block_order

from remote_data import epochs_as_local, loader, served, shards
from servers import FAST

pytestmark = [pytest.mark.timeout(180, method="thread"),
              pytest.mark.skipif(not _C.HTTP_AVAILABLE, reason="built without libcurl (`make setup` installs it)")]

BLOCK = 24_000  # a block: about two of these shards' images


def noisy_shards(rng, count):
    return shards(rng, count, samples=(5, 10), side=(80, 140), grain=120, pad=False)


def block_ranges(blob):
    """The blocks of a shard by the definition, from tarfile's reading of it: its images' byte spans
    grouped by the BLOCK-aligned stretch their first byte is in, each block [first byte, last byte + 1)."""
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        spans = [(m.offset_data, m.offset_data + m.size) for m in tar if m.name.endswith(".jpg")]
    blocks = {}
    for a, b in spans:
        lo, hi = blocks.get(a // BLOCK, (a, b))
        blocks[a // BLOCK] = (min(lo, a), max(hi, b))
    return sorted(blocks.values())


def cached_blocks(cache):
    """(the shards of which the cache holds a block now, those blocks' sizes): block files are named
    after their byte range."""
    shards_held, sizes = set(), set()
    for e in os.scandir(cache):
        if "__bytes_" in e.name and not e.name.startswith("."):
            try:
                sizes.add(e.stat().st_size)
            except FileNotFoundError:  # evicted while listed
                continue
            shards_held.add(e.name.split("__bytes_")[0].rsplit("-", 1)[-1])
    return shards_held, sizes


def test_a_dataset_larger_than_its_cache_streams_the_local_batches_in_blocks(faulty, tmp_path, rng):
    data = noisy_shards(rng, 10)
    urls, paths = served(faulty, tmp_path, data)
    largest, smallest = max(len(b) for _, b in data), min(len(b) for _, b in data)
    limit = 2 * largest
    cache = tmp_path / "cache"
    ds = fastpipe.WebDataset(urls, storage_options=FAST, cache_dir=cache, cache_limit=limit,
                             index_cache=tmp_path / "index", block_size=BLOCK)
    assert ds.fetch_stats["bytes_fetched"] == sum(len(b) for _, b in data)  # the index's: whole shards
    local = fastpipe.WebDataset(paths, index_cache="off", block_size=BLOCK)
    starts, _, _ = ds._blocks()
    np.testing.assert_array_equal(starts, local._blocks()[0])
    reference = [r for _, blob in data for r in block_ranges(blob)]
    assert len(starts) == len(reference) > 2 * len(urls)
    images = sum(b - a for a, b in reference)
    assert limit < images < sum(len(b) for _, b in data)

    window = dict(shuffle="blocks", shuffle_window=int(limit / 2), seed=int(rng.integers(1 << 30)))
    ours, theirs = loader(ds, **window), loader(local, **window)
    most_shards = []

    def blocks_held():
        held, sizes = cached_blocks(cache)
        most_shards.append(len(held))
        assert sizes <= {b - a for a, b in reference}

    for epoch, fetched in enumerate(epochs_as_local(ds, ours, theirs, cache, limit, each_batch=blocks_held)):
        # Each block at most once an epoch (the images' bytes, never a whole shard's), some of them ahead
        # of it, in the epoch before (at most a cache-full).
        assert images - limit <= fetched <= images + limit, (epoch, fetched, images)
    assert ours.stats()["shards_evicted"] > 0
    # The cache held blocks of more shards than it could hold whole shards.
    assert max(most_shards) > limit // smallest, max(most_shards)


def test_the_next_epochs_first_blocks_arrive_before_it_starts(faulty, tmp_path, rng):
    data = noisy_shards(rng, 10)
    urls, paths = served(faulty, tmp_path, data)
    cache = tmp_path / "cache"
    ds = fastpipe.WebDataset(urls, storage_options=FAST, cache_dir=cache, cache_limit=2 * max(len(b) for _, b in data),
                             index_cache="off", block_size=BLOCK)
    window = dict(shuffle="blocks", shuffle_window=max(len(b) for _, b in data), seed=int(rng.integers(1 << 30)))
    ld = loader(ds, timeout=20, **window)
    for _ in ld:  # epoch 0
        pass
    starts, groups, _ = ds._blocks()
    order = block_order(starts, len(ds), seed=window["seed"], epoch=1, window=ld._blocks[2], groups=groups)
    reference = [(name, r) for name, blob in data for r in block_ranges(blob)]
    wanted = {f"{reference[b][0]}__bytes_{reference[b][1][0]}-{reference[b][1][1] - 1}_"
              for b in np.unique(ds._shard_blocks.of[order[:3]])}
    deadline = time.monotonic() + 30
    while not all(any(n.endswith(w) for n in os.listdir(cache)) for w in wanted):  # fetched by the stream's thread
        assert time.monotonic() < deadline, f"epoch 1's first blocks {sorted(wanted)} were not fetched ahead"
        time.sleep(0.05)
    for name, blob in data:  # from now on every GET stalls: epoch 1's first batch must need none
        faulty.put("/" + name, blob, faults=["stall"] * 100)
    try:
        _, y = next(iter(ld))
    finally:
        faulty.release.set()
    ld.close()
    theirs = loader(fastpipe.WebDataset(paths, index_cache="off", block_size=BLOCK), **window)
    theirs.set_epoch(1)
    np.testing.assert_array_equal(y.numpy(), next(iter(theirs))[1].numpy())


def test_a_block_cut_short_or_refused_resumes_at_its_byte(faulty, tmp_path, rng):
    data = noisy_shards(rng, 4)
    urls, paths = served(faulty, tmp_path, data)
    ds = fastpipe.WebDataset(urls, storage_options=dict(FAST, part_size=64 << 10), cache_dir=tmp_path / "cache",
                             cache_limit=max(len(b) for _, b in data) + 1, index_cache="off", block_size=BLOCK)
    local = fastpipe.WebDataset(paths, index_cache="off", block_size=BLOCK)
    for name, blob in data:  # each shard's next GETs: half a body, a 503
        faulty.put("/" + name, blob, faults=["truncate", "503"])
    with faulty.lock:
        faulty.log.clear()
    got = [y.numpy().copy() for _, y in loader(ds, shuffle=False)]
    np.testing.assert_array_equal(np.concatenate(got), np.concatenate([y.numpy() for _, y in loader(local, shuffle=False)]))
    assert ds.fetch_stats["retries"] >= 2 * len(data)
    for name, blob in data:
        blocks = block_ranges(blob)
        asked = [tuple(int(v) for v in r.split("=")[1].split("-")) for r in faulty.gets("/" + name)]
        # Every GET inside one block; the truncated one resumed inside it, at the byte it stopped at.
        assert all(any(a <= lo and hi < b for a, b in blocks) for lo, hi in asked), (asked, blocks)
        assert any(lo not in {a for a, _ in blocks} for lo, _ in asked), (asked, blocks)
        assert len(asked) >= len(blocks) + 2


def test_a_block_that_changed_on_the_server_fails_naming_its_url_and_bytes(faulty, tmp_path, rng):
    data = noisy_shards(rng, 4)
    urls, _ = served(faulty, tmp_path, data)
    ds = fastpipe.WebDataset(urls, storage_options=dict(FAST, max_attempts=2), cache_dir=tmp_path / "cache",
                             cache_limit=max(len(b) for _, b in data) + 1, index_cache="off", block_size=BLOCK)
    name, blob = data[2]
    faulty.put("/" + name, blob[::-1])  # a new version: its ETag differs from the one the dataset was made with
    with pytest.raises(Exception, match=rf"{name} \(bytes \d+-\d+\)': HTTP 412, changed on the server"):
        for _ in loader(ds, shuffle=False):
            pass


def test_blocks_need_a_server_that_takes_ranges_and_a_positive_size(faulty, tmp_path, rng):
    data = noisy_shards(rng, 3)
    urls, paths = served(faulty, tmp_path, data)
    with pytest.raises(ValueError, match="block_size must be at least 1 byte"):
        fastpipe.WebDataset(paths, block_size=0)
    each = fastpipe.WebDataset(paths, block_size=1, index_cache="off")
    assert len(each._blocks()[0]) == len(each)  # a block per sample
    faulty.ranges = False  # a block would cost its whole shard's transfer: whole shards are the blocks
    ds = fastpipe.WebDataset(urls, storage_options=FAST, cache_dir=tmp_path / "cache",
                             cache_limit=max(len(b) for _, b in data) + 1, index_cache="off", block_size=BLOCK)
    assert len(ds._blocks()[0]) == len(urls)
    local = fastpipe.WebDataset(paths, index_cache="off", block_size=1 << 30)
    got = np.concatenate([y.numpy() for _, y in loader(ds, shuffle=False)])
    np.testing.assert_array_equal(got, np.concatenate([y.numpy() for _, y in loader(local, shuffle=False)]))
