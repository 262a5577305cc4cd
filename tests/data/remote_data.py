"""The remote tests' shards, served and on local disk, and their Loader (test_remote_stream.py,
test_remote_blocks.py)."""

import os

import numpy as np

import fastpipe
from fastpipe.transforms import RandomResizedCrop

from jpegs import jpeg_bytes, picture
from tar_files import tar_bytes


def shards(rng, count, *, samples=(3, 7), side=(20, 60), grain=10, pad=True):
    """`count` tar shards of `samples` JPEG samples each (sides in `side`, noise of +-`grain`), with
    labels and (`pad`) a member of 30-50 KB of noise: [(name, bytes)]."""
    out, n = [], 0
    for k in range(count):
        members = []
        for _ in range(int(rng.integers(*samples))):
            h, w = (int(v) for v in rng.integers(*side, 2))
            members += [(f"s{n:05d}.jpg", jpeg_bytes(picture(rng, h, w, grain=grain))),
                        (f"s{n:05d}.cls", str(int(rng.integers(0, 5))).encode())]
            if pad:
                members.append((f"s{n:05d}.pad", rng.bytes(int(rng.integers(30_000, 50_000)))))
            n += 1
        out.append((f"part-{k:02d}.tar", tar_bytes(members)))
    return out


def served(faulty, tmp_path, data):
    """The shards on the server and on local disk: (URLs, local paths)."""
    local = tmp_path / "local"
    local.mkdir(exist_ok=True)
    for name, blob in data:
        (local / name).write_bytes(blob)
        faulty.put("/" + name, blob)
    return [faulty.url + "/" + n for n, _ in data], [str(local / n) for n, _ in data]


def cached_bytes(cache):
    """What the cache's data files hold (lock and temporary files are hidden: a leading dot)."""
    total = 0
    for e in os.scandir(cache):
        if not e.name.startswith("."):
            try:
                total += e.stat().st_size
            except FileNotFoundError:  # evicted while listed
                pass
    return total


def loader(ds, **kw):
    kw = dict(dict(timeout=60, num_threads=2), **kw)
    return fastpipe.Loader(ds, batch_size=3, transforms={0: RandomResizedCrop(20, dct_scaling=False)}, **kw)


def epochs_as_local(ds, ours, theirs, cache, limit, epochs=2, each_batch=None):
    """Reads `epochs` epochs of Loader `ours` (over remote `ds`) beside `theirs` (the same shards on local
    disk): every batch equal, the cache never over `limit` after any (then `each_batch()`). Returns the
    bytes each epoch fetched."""
    fetched = []
    for _ in range(epochs):
        before = ds.fetch_stats["bytes_fetched"]
        for (x, y), (rx, ry) in zip(ours, theirs, strict=True):
            np.testing.assert_array_equal(y.numpy(), ry.numpy())
            np.testing.assert_array_equal(x.numpy(), rx.numpy())
            assert cached_bytes(cache) <= limit
            if each_batch:
                each_batch()
        fetched.append(ds.fetch_stats["bytes_fetched"] - before)
    return fetched
