"""fastpipe.WebDataset against the webdataset package's own loader, on local tar shards (warm page cache).

The images suite's JPEG corpus (ImageNet-like sizes and bytes, fastpipe.bench.image_corpus) is written as
WebDataset shards (``<key>.jpg`` + ``<key>.cls``). Rows, each yielding float32 [B, 3, S, S] NCHW batches
of RandomResizedCrop(S) + flip + ImageNet normalisation with int64 labels, at k threads or workers:

- fastpipe.WebDataset(shards) + Loader(num_threads=k, shuffle=True)
- fastpipe.ImageFolder(tree) + Loader(num_threads=k): the same images as files (what the shards cost)
- webdataset: WebDataset(shards, shardshuffle, nodesplitter) .shuffle(1000) .decode("pil") .to_tuple
  .map_tuple(v2 transforms) + WebLoader(num_workers=k, batch_size=B): the webdataset README's recipe

Rows alternate within each round (rounds x rows, one process), a pass is one epoch after a warm-up epoch;
the table gives each row's median images/s and the median of its per-round ratio to fastpipe.WebDataset.
"""

import argparse
import os
import statistics
import sys
import time

import torch

import fastpipe
from fastpipe.bench import common
from fastpipe.bench.shards import MEAN, STD, corpus_shards, webdataset_row


def fastpipe_rows(shards, tree, size, batch, threads):
    tf = fastpipe.transforms.RandomResizedCrop(size, mean=MEAN, std=STD)
    wds_ds = fastpipe.WebDataset(shards)
    folder = fastpipe.ImageFolder(tree, cache_dir="off")
    return {
        "fastpipe.WebDataset": lambda: fastpipe.Loader(wds_ds, batch_size=batch, shuffle=True, drop_last=True,
                                                       num_threads=threads, transforms={0: tf}),
        "fastpipe.ImageFolder (files)": lambda: fastpipe.Loader(folder, batch_size=batch, shuffle=True, drop_last=True,
                                                                num_threads=threads, transforms={0: tf}),
    }


def one_pass(make):
    loader = make()
    for _ in loader:  # warm-up epoch (workers started, page cache and decoders warm)
        pass
    n, t0 = 0, time.perf_counter()
    for x, y in loader:
        assert x.dtype == torch.float32 and x.shape[1] == 3 and y.dtype == torch.int64
        n += len(y)
    seconds = time.perf_counter() - t0
    close = getattr(loader, "close", None)
    if close:
        close()
    return n / seconds, n


def add_corpus_arguments(p, name):
    """The corpus, shard and loader options."""
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--per-shard", type=int, default=250)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--data-dir", default="benchmarks/data")
    p.add_argument("--out", default=None, help=f"the results JSON (default: benchmarks/results/{name}_<host>_<date>.json)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_corpus_arguments(p, "webdataset_local")
    args = p.parse_args(argv)
    out = common.Report("webdataset_local", "benchmarks/results", json_path=args.out, options=vars(args))
    c, shards = corpus_shards(args.data_dir, args.images, args.per_shard, args.threads, out)
    rows = {**fastpipe_rows(shards, c.tree, args.size, args.batch_size, args.threads),
            **webdataset_row(shards, args.size, args.batch_size, args.threads)}
    rates = {k: [] for k in rows}
    for r in range(args.rounds):
        for key, make in rows.items():
            rate, n = one_pass(make)
            rates[key].append(rate)
            out.log(f"round {r + 1}/{args.rounds} {key}: {rate:.0f} images/s ({n} images)")
    ours = "fastpipe.WebDataset"
    table = [[key, f"{statistics.median(v):.0f}", f"{statistics.median(a / b for a, b in zip(v, rates[ours])):.2f}x"]
             for key, v in rates.items()]
    out.table(["loader", "images/s (median)", "x fastpipe.WebDataset (median of per-round ratios)"], table,
              title=f"{args.images} JPEGs in {len(shards)} shards, {args.size}x{args.size}, batch {args.batch_size}, "
                    f"k={args.threads}, warm page cache, {args.rounds} rounds")
    out.save({"rates": rates, "shards": len(shards), "torch": torch.__version__})
    return 0


if __name__ == "__main__":
    sys.exit(main())
