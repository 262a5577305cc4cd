"""The remote tests' shards, served and on local disk, and their Loader (test_remote_stream.py,
test_remote_blocks.py)."""

import os

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
