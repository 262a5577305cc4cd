"""Ranks of a real process group (gloo, one process each, started here) reading WebDataset shards from
moto's S3 server on 127.0.0.1 through one shared cache: every sample exactly once per epoch, each shard
fetched once for the node, and a run stopped mid-epoch resumed by a world of another size (2 -> 3,
3 -> 2) reading exactly the samples the first world had not. Each sample's label is its index, so the
labels the ranks report are the samples they read."""

import json
import subprocess
import sys

import numpy as np
import pytest

from fastpipe._ext import _C

from jpegs import jpeg_bytes, picture
from tar_files import tar_bytes

pytestmark = [pytest.mark.timeout(300, method="thread"),
              pytest.mark.skipif(not _C.HTTP_AVAILABLE, reason="built without libcurl (`make setup` installs it)")]

N, PER_SHARD, BATCH = 72, 9, 4  # 72 = 2 * 3 * 12: every world here splits an epoch evenly

RANK = r"""
import json, sys
import torch.distributed as dist
import fastpipe
from fastpipe.transforms import RandomResizedCrop

cfg, rank = json.loads(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo", init_method=cfg["init"], rank=rank, world_size=cfg["world"])
ds = fastpipe.WebDataset(cfg["urls"], storage_options=cfg["options"], cache_dir=cfg["cache"],
                         index_cache=cfg["index"])
ld = fastpipe.Loader(ds, batch_size=cfg["batch"], shuffle="blocks", shuffle_window=cfg["window"], seed=7,
                     num_threads=1, transforms={0: RandomResizedCrop(16)}, timeout=120)
if cfg["state"]:
    ld.load_state_dict(cfg["state"])
read = []
for i, (x, y) in enumerate(ld):
    read += y.tolist()
    if i + 1 == cfg["batches"]:
        break
# Each rank reports its own: a gloo collective at the end can abort the exit (examples/train.py's end).
print(json.dumps({"read": read, "fetched": ds.fetch_stats["shards_fetched"], "state": ld.state_dict(),
                  "world": dist.get_world_size()}))
dist.destroy_process_group()
"""


@pytest.fixture
def shards(s3, rng, tmp_path):
    """N samples in shards of PER_SHARD, labels their indices, on the S3 server: (their URLs, a
    shuffle_window of about three of them)."""
    urls, sizes = [], []
    for k in range(N // PER_SHARD):
        members = []
        for i in range(k * PER_SHARD, (k + 1) * PER_SHARD):
            h, w = (int(v) for v in rng.integers(16, 40, 2))
            members += [(f"s{i:04d}.jpg", jpeg_bytes(picture(rng, h, w))), (f"s{i:04d}.cls", str(i).encode())]
        data = tar_bytes(members)
        urls.append(s3.put("ranks", f"{tmp_path.name}/part-{k}.tar", data))
        sizes.append(len(data))
    return urls, int(3 * np.mean(sizes))


def run_world(s3, shards, tmp_path, world, name, state=None, batches=None):
    """`world` ranks, one process each: (what each read, its shards fetched), rank 0's state after."""
    urls, window = shards
    cfg = dict(init=f"file://{tmp_path}/{name}.store", world=world, urls=urls, options=s3.options(),
               cache=str(tmp_path / "cache"), index=str(tmp_path / "index"), batch=BATCH, window=window,
               state=state, batches=batches)
    procs = [subprocess.Popen([sys.executable, "-c", RANK, json.dumps(cfg), str(r)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(world)]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    ranks = [json.loads(out) for out, _ in outs]
    assert [r["world"] for r in ranks] == [world] * world
    return [r["read"] for r in ranks], [r["fetched"] for r in ranks], ranks[0]["state"]


def test_gloo_ranks_read_every_sample_once_and_resume_in_another_world(s3, shards, tmp_path):
    read, fetched, _ = run_world(s3, shards, tmp_path, 2, "whole")
    assert sorted(read[0] + read[1]) == list(range(N)) and len(read[0]) == len(read[1])
    assert sum(fetched) == len(shards[0]), fetched  # one download a shard for the node's shared cache
    for old, new in ((2, 3), (3, 2)):
        k = 3
        before, _, state = run_world(s3, shards, tmp_path, old, f"stop{old}", batches=k)
        consumed = [i for r in before for i in r]
        assert len(consumed) == old * k * BATCH == len(set(consumed))
        after, _, _ = run_world(s3, shards, tmp_path, new, f"resume{new}", state=state)
        resumed = [i for r in after for i in r]
        assert len({len(r) for r in after}) == 1, "every rank reads as many samples"
        assert sorted(consumed + resumed) == list(range(N)), (old, new)
