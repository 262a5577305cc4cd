"""WebDataset shards streaming through a cache smaller than the dataset (csrc/core/shard_stream.cpp):
the batches are those of the same shards on local disk, the cache never holds more than its limit, each
epoch fetches each shard about once, reading starts before the last shard arrives, and failures and
closes end waits with errors naming the URL. Served by the scripted HTTP server of tests/data/servers.py
on 127.0.0.1."""

import io
import itertools
import os
import sys
import tarfile
import threading
import time

import numpy as np
import pytest

import fastpipe
from fastpipe._ext import _C
from fastpipe.data import webdataset_index
from fastpipe.data.order import block_order

from jpegs import jpeg_bytes, picture
from remote_data import cached_bytes, epochs_as_local, loader, served, shards
from servers import FAST
from tar_files import tar_bytes

pytestmark = [pytest.mark.timeout(180, method="thread"),
              pytest.mark.skipif(not _C.HTTP_AVAILABLE, reason="built without libcurl (`make setup` installs it)")]


def test_a_dataset_larger_than_its_cache_streams_the_batches_local_shards_give(faulty, tmp_path, rng):
    data = shards(rng, 12)
    urls, paths = served(faulty, tmp_path, data)
    total, largest = sum(len(b) for _, b in data), max(len(b) for _, b in data)
    limit = 2 * largest
    assert limit < 0.6 * total
    cache = tmp_path / "cache"
    opts = dict(storage_options=FAST, cache_dir=cache, cache_limit=limit, index_cache=tmp_path / "index")
    ds = fastpipe.WebDataset(urls, **opts)  # indexed a cache-full at a time
    assert cached_bytes(cache) <= limit
    assert ds.fetch_stats["bytes_fetched"] == total
    local = fastpipe.WebDataset(paths, index_cache="off")
    assert [ds.key(i) for i in range(len(ds))] == [local.key(i) for i in range(len(local))]
    assert ds.targets == local.targets
    window = dict(shuffle="blocks", shuffle_window=largest // 2, seed=int(rng.integers(1 << 30)))
    ours, theirs = loader(ds, **window), loader(local, **window)
    for epoch, fetched in enumerate(epochs_as_local(ds, ours, theirs, cache, limit)):
        # Each shard about once an epoch (those the cache still held from before, not at all; the next
        # epoch's first ones ahead of it, at most a cache-full), and the ones read earliest no more once
        # the cache is full: more than the limit was evicted.
        assert total - limit <= fetched <= total + limit, (epoch, fetched, total)
    assert ours.stats()["shards_evicted"] > 0
    # A hit is a shard a pass found in the cache without fetching it: at most those the cache held at
    # each pass's start (the limit's worth), never the ones fetched ahead (none, when the pass reads the
    # shards it held last and they were evicted for earlier ones: test_remote_shards counts hits where
    # the cache holds everything).
    assert ds.fetch_stats["cache_hits"] <= 2 * limit // min(len(b) for _, b in data)
    ours.close()

    # Indexed already: a new dataset (in a new cache) fetches nothing until read, and its first batch
    # comes while the transfers of every shard it does not hold are stalled.
    again = fastpipe.WebDataset(urls, **dict(opts, cache_dir=tmp_path / "new"))
    assert again.fetch_stats["bytes_fetched"] == 0 and again.fetch_stats["requests"] == len(urls)  # HEADs
    ld = loader(again, **window)
    starts, groups, _ = again._blocks()
    order = block_order(starts, len(again), seed=window["seed"], epoch=0, window=ld._blocks[2], groups=groups)
    first_shards = set(again._shard_of[order[:3]].tolist())
    for k, (name, blob) in enumerate(data):
        if k not in first_shards:
            faulty.put("/" + name, blob, faults=["stall"])
    first = next(iter(ld))
    np.testing.assert_array_equal(first[1].numpy(), next(iter(loader(local, **window)))[1].numpy())
    assert again.fetch_stats["bytes_fetched"] < total
    faulty.release.set()


def test_a_window_is_read_while_the_rest_of_its_shards_is_on_its_way(faulty, tmp_path, rng):
    # Whole shards (the cache holds them all) of many parts each; the first batch reads a few parts of a
    # few shards. Every request for a part it does not read is held: the batch still comes, because the
    # window's parts are asked for first and read as they arrive, before any shard is complete.
    data = shards(rng, 3, samples=(24, 30))
    urls, paths = served(faulty, tmp_path, data)
    part = FAST["part_size"]
    assert min(len(b) for _, b in data) > 12 * part
    index = tmp_path / "index"
    fastpipe.WebDataset(urls, storage_options=FAST, cache_dir=tmp_path / "indexing", index_cache=index)
    ds = fastpipe.WebDataset(urls, storage_options=FAST, cache_dir=tmp_path / "cache", index_cache=index,
                             block_size=4 * part)
    local = fastpipe.WebDataset(paths, index_cache="off", block_size=4 * part)
    window = dict(shuffle="blocks", shuffle_window=8 * part, seed=int(rng.integers(1 << 30)))
    ld = loader(ds, **window)
    starts, groups, _ = ds._blocks()
    assert ld._blocks[2] == 2 and len(starts) > 6
    order = block_order(starts, len(ds), seed=window["seed"], epoch=0, window=2, groups=groups)
    members = [{m.name: m for m in tarfile.open(fileobj=io.BytesIO(blob))} for _, blob in data]
    needed = set()
    for i in order[:3]:
        k = int(ds._shard_of[i])
        m = members[k][ds.key(i) + ".jpg"]
        needed |= {("/" + data[k][0], p) for p in range(m.offset_data // part, (m.offset_data + m.size - 1) // part + 1)}
    faulty.hold = lambda path, first: (path, first // part) not in needed
    logged = len(faulty.log)
    it = iter(ld)
    first = next(it)
    asked = [(p, int(r.split("=")[1].split("-")[0]) // part) for m, p, r in faulty.log[logged:] if m == "GET"]
    assert needed <= set(asked) and not needed >= set(asked)  # others asked for, and held
    assert ds.fetch_stats["shards_fetched"] == 0 and ds.fetch_stats["bytes_fetched"] <= len(needed) * part
    assert ds.fetch_stats["shards_fetching"] > 0
    faulty.release.set()
    theirs = iter(loader(local, **window))
    for (x, y), (rx, ry) in zip(itertools.chain([first], it), theirs, strict=True):
        np.testing.assert_array_equal(y.numpy(), ry.numpy())
        np.testing.assert_array_equal(x.numpy(), rx.numpy())
    assert ds.fetch_stats["shards_fetched"] == len(data) and ds.fetch_stats["shards_fetching"] == 0
    assert ds.fetch_stats["bytes_fetched"] == sum(len(b) for _, b in data)  # each part once
    ld.close()


def test_orders_that_would_refetch_every_shard_are_refused(faulty, tmp_path, rng):
    data = shards(rng, 6)
    urls, _ = served(faulty, tmp_path, data)
    largest = max(len(b) for _, b in data)
    ds = fastpipe.WebDataset(urls, storage_options=FAST, cache_dir=tmp_path / "cache", cache_limit=2 * largest,
                             index_cache="off")
    with pytest.raises(ValueError, match=r"more than cache_limit=.*shuffle=True draws each sample from any shard"):
        loader(ds, shuffle=True)
    with pytest.raises(ValueError, match=r"shuffle_window='1MB' \(\d+ blocks\) does not fit in cache_limit"):
        loader(ds, shuffle="blocks", shuffle_window="1MB")
    assert len([b for b in loader(ds, shuffle=False)]) == -(-len(ds) // 3)
    with pytest.raises(ValueError, match=r"cache_limit is 1000 bytes .* but the shard '.*part-00.tar' alone is"):
        fastpipe.WebDataset(urls, storage_options=FAST, cache_dir=tmp_path / "cache", cache_limit=1000)


def test_a_shard_gone_from_the_server_fails_its_batches_naming_its_url(faulty, tmp_path, rng):
    data = shards(rng, 4)
    urls, _ = served(faulty, tmp_path, data)
    ds = fastpipe.WebDataset(urls, storage_options=dict(FAST, max_attempts=2), cache_dir=tmp_path / "cache",
                             cache_limit=2 * max(len(b) for _, b in data), index_cache="off")
    with faulty.lock:
        del faulty.objects["/part-03.tar"]
    for d in os.scandir(tmp_path / "cache"):
        if d.name.endswith("part-03.tar"):
            os.unlink(d.path)  # still cached from the index: the server's answer counts
    with pytest.raises(Exception, match=r"part-03\.tar.*404|404.*part-03\.tar") as err:
        for _ in loader(ds, shuffle=False):
            pass
    assert faulty.url + "/part-03.tar" in str(err.value)


def test_a_shard_that_changes_while_it_is_read_fails_its_readers_and_leaves_no_file(faulty, tmp_path, rng):
    # The first parts of part-00 arrive and are read; then the object changes on the server: the reads
    # waiting for its later parts end with an error naming it, and no file of it stays in the cache.
    data = shards(rng, 2, samples=(24, 30))
    urls, _ = served(faulty, tmp_path, data)
    index = tmp_path / "index"
    fastpipe.WebDataset(urls, storage_options=FAST, cache_dir=tmp_path / "indexing", index_cache=index)
    name, blob = data[0]
    faulty.put("/" + name, blob, faults=["ok", "ok", "replace:" + rng.bytes(len(blob)).hex()])
    cache = tmp_path / "cache"
    ds = fastpipe.WebDataset(urls, storage_options=FAST, cache_dir=cache, index_cache=index)
    with pytest.raises(Exception, match=r"part-00\.tar.*changed on the server") as err:
        for _ in loader(ds, shuffle=False, num_threads=1):
            pass
    assert faulty.url + "/part-00.tar" in str(err.value)
    assert not [e.name for e in os.scandir(cache) if "part-00" in e.name and not e.name.endswith(".lock")]


def stalled_dataset(faulty, tmp_path, rng):
    """(the shards, a dataset of them whose index is kept but whose cache is empty), each shard's next GET
    stalling on the server until faulty.release (a minute at most)."""
    data = shards(rng, 3)
    urls, _ = served(faulty, tmp_path, data)
    index = tmp_path / "index"
    fastpipe.WebDataset(urls, storage_options=FAST, cache_dir=tmp_path / "warm", index_cache=index)
    for name, blob in data:
        faulty.put("/" + name, blob, faults=["stall"])
    ds = fastpipe.WebDataset(urls, storage_options=dict(FAST, stall_timeout=120), cache_dir=tmp_path / "cold",
                             index_cache=index)
    return data, ds


def test_closing_a_loader_ends_its_readers_wait_for_a_stalled_shard(faulty, tmp_path, rng):
    _, ds = stalled_dataset(faulty, tmp_path, rng)
    # Every GET held, not only each shard's first: parts are asked for many at once, and under load the
    # first to reach the server was sometimes a later part, so the first batch's arrived (no TimeoutError).
    faulty.hold = lambda path, start: True
    ld = loader(ds, shuffle=False, timeout=0.5)
    with pytest.raises(TimeoutError):
        next(iter(ld))
    start = time.monotonic()
    ld.close()
    del ld, ds  # the stream's fetch thread stops too
    assert time.monotonic() - start < 10  # polled every 100 ms, not the stall's minute


def test_a_network_stall_shows_in_the_monitors_timeline(faulty, tmp_path, rng):
    data, ds = stalled_dataset(faulty, tmp_path, rng)
    ld = loader(ds, shuffle=False)
    got = []
    with fastpipe.Monitor(interval=0.02, loaders=[ld]) as mon:
        reading = threading.Thread(target=lambda: got.extend(y.numpy().copy() for _, y in ld))
        reading.start()
        deadline = time.monotonic() + 60
        while not any((s.get("network_wait_pct") or 0) > 50 for s in mon.samples):  # readers stalled
            assert time.monotonic() < deadline, mon.samples[-1]
            time.sleep(0.02)  # polls the timeline the monitor's thread writes: bounded by the deadline
        stalled = mon.samples[-1]
        assert stalled["bytes_fetched"] < sum(len(b) for _, b in data)
        faulty.release.set()
        reading.join(60)
        # The epoch may end before the shards' last parts land (a tar's closing blocks hold no sample):
        # the timeline shows them once they have.
        while mon.samples[-1]["bytes_fetched"] < sum(len(b) for _, b in data):
            assert time.monotonic() < deadline, mon.samples[-1]
            time.sleep(0.02)
    assert not reading.is_alive() and sum(len(y) for y in got) == len(ds)
    last, s = mon.samples[-1], mon.summary()
    assert last["bytes_fetched"] == sum(len(b) for _, b in data) == ld.stats()["bytes_fetched"]
    assert last["network_wait_seconds"] == pytest.approx(ld.stats()["network_wait_seconds"])
    assert last["network_wait_seconds"] >= stalled["network_wait_seconds"] > 0
    assert s["fetch_mbps"] > 0 and s["network_wait_pct"] > 0 and "network wait" in str(mon)


def test_the_index_of_remote_shards_is_read_in_groups_with_progress(faulty, tmp_path, rng, monkeypatch):
    data = shards(rng, 5)
    odd = [("a.jpg", jpeg_bytes(picture(rng, 30, 20))), ("a.cls", b"1"),
           ("b.jpg", jpeg_bytes(picture(rng, 20, 30))[:300]), ("b.cls", b"2"), ("c.cls", b"3"),
           ("d.jpg", jpeg_bytes(picture(rng, 25, 25))), ("d.cls", b"4")]
    data.append(("part-05.tar", tar_bytes(odd)))  # in the last group: a truncated image, a sample without one
    urls, paths = served(faulty, tmp_path, data)

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(webdataset_index, "_GROUP_SHARDS", 2)  # 3 groups: joined into one index
    with pytest.warns(UserWarning):
        local = fastpipe.WebDataset(paths, index_cache="off")
    with pytest.warns(UserWarning):
        ds = fastpipe.WebDataset(urls, storage_options=FAST, cache_dir=tmp_path / "cache", index_cache="off")
    assert [ds.key(i) for i in range(len(ds))] == [local.key(i) for i in range(len(local))]
    assert ds.targets == local.targets and ds.image_sizes.tolist() == local.image_sizes.tolist()
    assert ds._shard_of.tolist() == local._shard_of.tolist()
    assert [(i, k) for i, k, _ in ds.bad] == [(i, k) for i, k, _ in local.bad] and ds.bad[0][1] == "b"
    assert list(ds.without_image.values()) == list(local.without_image.values()) == [1]
    shown = terminal.getvalue()
    assert "fetching shards for the index" in shown and "100%" in shown, shown[-500:]


def test_a_forked_child_gets_a_clear_error_not_a_hang(faulty, tmp_path, rng):
    """A remote WebDataset's fetch thread stays in the process that made it: a forked child using the
    dataset gets a RuntimeError saying so at once (it would otherwise wait for shards forever), and the
    parent goes on."""
    data = shards(rng, 3)
    urls, _ = served(faulty, tmp_path, data)
    ds = fastpipe.WebDataset(urls, storage_options=FAST, cache_dir=tmp_path / "cache", index_cache="off")
    ld = loader(ds, shuffle=False)
    it = iter(ld)
    first = next(it)  # the parent's readers and fetch thread run during the fork
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 1
        try:
            try:
                for _ in loader(ds, shuffle=False):
                    pass
            except RuntimeError as e:
                code = 3 if "made in another process (before a fork)" in str(e) else 4
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    done, status = os.waitpid(pid, os.WNOHANG)
    while not done:
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung")
        time.sleep(0.05)  # polls the child's exit: bounded by the deadline
        done, status = os.waitpid(pid, os.WNOHANG)
    assert os.waitstatus_to_exitcode(status) == 3, "the child's error did not say why (4) or it read on (1)"
    assert len(first[1]) + sum(len(y) for _, y in it) == len(ds)
