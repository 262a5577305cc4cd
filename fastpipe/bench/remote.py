"""The remote suite (``python -m fastpipe.bench remote``): fastpipe.WebDataset on shards in S3 and on an
HTTP server, against the same shards on local disk and the peers streaming them, at equal cores.

Servers on 127.0.0.1, started here (fastpipe.bench.servers): nginx serving the shards' folder, and moto's
S3 server (signatures checked) holding them; each directly (0 ms) and through a proxy that adds a round
trip time to every exchange (--rtt-ms, default 20). The corpus is the images suite's ImageNet-like JPEGs
written as shards (fastpipe/bench/shards.py). Every row reads one epoch of RandomResizedCrop(S) +
flip + normalise batches (float32 NCHW, int64 labels) with k threads or workers; fastpipe's rows in a
block shuffle (shuffle="blocks", --window), what data in a store calls for:

- fastpipe first time: an empty cache_dir and an empty index cache, then WebDataset(urls) (fetching every
  shard for the index) and the epoch; the time counts both, the first batch's from the construction's start
- fastpipe cold: an empty cache_dir, the index kept: WebDataset(urls) (HEADs only) and the epoch, whose
  shards stream in while it is read
- fastpipe warm: the same with the cache filled (nothing fetched)
- fastpipe stream: cache_limit half the shards' bytes, the index kept: every epoch streams them all; its
  second epoch is timed (the first also fetches the second's first window)
- fastpipe cold and warm with k - 1 reader threads, over http at --rtt-ms: a core left to the network's
  side (the proxy, nginx, the kernel's loopback, the fetch), whose CPU the other rows take from the
  readers on a small machine: whether the latency is hidden where the CPU allows
- fastpipe local: WebDataset(the local shards) constructed, then the epoch
- webdataset + WebLoader: its README's recipe over the http URLs (curl per shard, as webdataset opens
  them), one warm-up epoch first; over S3 it is reported as not run, with the reason
- over S3 at --rtt-ms, litdata, Mosaic streaming and s3torchconnector (fastpipe/bench/remote_peers.py: each
  converted from the same images, or the same shards): a first epoch with their cache empty and a second
  epoch; a peer not installed (run this with an interpreter that has them) or failing is reported as not
  run, with why (one that fails after rounds it completed: those rounds, and why it stopped)

"s3" is moto (every signature checked, at a large CPU cost on a small machine: see the servers' CPU
column); "s3 via nginx" answers the same S3 requests from a folder without checking signatures
(fastpipe.bench.servers.NginxS3), what a store's throughput looks like when its server is not the
bottleneck.

Rounds alternate the rows; the table gives medians (images/s over the timed span, time to the first
batch, bytes fetched over the shards' bytes, the CPU seconds the servers and the delay proxy spent during the
row: taken from the 2 cores the loaders share with them) and each row's median ratio to fastpipe local
and to fastpipe warm of the same store in the same round.
"""

import argparse
import os
import shutil
import statistics
import tempfile
import time

import torch

import fastpipe
from fastpipe.bench import servers
from fastpipe.bench.remote_peers import PEERS
from fastpipe.bench.shards import MEAN, STD, corpus_shards, images_of, webdataset_row


def epoch(loader, start):
    """One epoch of `loader`: (images/s from `start` to its end, images/s after its first batch, seconds from
    `start` to its first batch). The second is the rate once the first shards are in: a benchmark's epoch
    of seconds is dominated by that start, a real epoch of hours is not."""
    n, first, first_n = 0, None, 0
    for x, y in loader:
        if first is None:
            first, first_n = time.perf_counter() - start, len(y)
        assert x.dtype == torch.float32 and x.shape[1] == 3 and y.dtype == torch.int64
        n += len(y)
    seconds = time.perf_counter() - start
    return n / seconds, (n - first_n) / (seconds - first) if seconds > first else float("nan"), first


def fastpipe_pass(urls, args, cache=None, options=None, index=None, limit=None, epochs=1):
    """The last of `epochs` epochs (the first timed from the dataset's construction): its rates and the
    bytes it fetched. A stream through a cache smaller than the shards is read for 2: its first epoch also
    fetches the second's first window, as every epoch does the next's."""
    tf = fastpipe.transforms.RandomResizedCrop(args.size, mean=MEAN, std=STD)
    start = time.perf_counter()
    remote = dict(storage_options=options, cache_dir=cache, cache_limit=limit) if cache else {}
    ds = fastpipe.WebDataset(urls, index_cache=index, **remote)
    ld = fastpipe.Loader(ds, batch_size=args.batch_size, shuffle="blocks", shuffle_window=args.window,
                         drop_last=True, num_threads=args.threads, transforms={0: tf})

    def fetched():
        """The bytes fetched so far once the fetches under way have landed (untimed): an epoch can end
        before the next one's first window, which it fetches ahead, has all arrived."""
        if not ds.fetch_stats:
            return 0
        deadline = time.monotonic() + 60
        while ds.fetch_stats["shards_fetching"] and time.monotonic() < deadline:
            time.sleep(0.005)
        return ds.fetch_stats["bytes_fetched"]

    before = after = 0  # the first epoch's bytes include the construction's (an index built from the shards)
    for _ in range(epochs):
        before, rates = after, epoch(ld, start)
        after = fetched()
        start = time.perf_counter()
    ld.close()
    return *rates, after - before


def peer_rows(label, name, peer, images, labels, s3, endpoint, work, args):
    """Rows "<peer> first epoch" (its cache emptied) and "<peer> second epoch" (the same loader again):
    the first runs both epochs and hands the second its figures."""
    make, cache = peer(images, labels, s3, endpoint, work, args)
    second = {}

    def first():
        if cache:
            emptied(cache)
        loader = make()
        rates = epoch(loader, time.perf_counter())
        second["result"] = epoch(loader, time.perf_counter())
        return *rates, None

    def then():
        return *second.pop("result"), None

    return {f"{label}: {name}, first epoch": first, f"{label}: {name}, second epoch": then}


def emptied(*folders):
    for f in folders:
        shutil.rmtree(f, ignore_errors=True)


def webdataset_pass(urls, args):
    make = next(iter(webdataset_row(urls, args.size, args.batch_size, args.threads).values()))
    loader = make()
    for _ in loader:  # warm-up epoch: workers started
        pass
    return *epoch(loader, time.perf_counter()), None


# What each row's rounds record (run()'s values in this order, then the servers' CPU seconds).
METRICS = ("rates", "rates_after_first_batch", "first_batch", "fetched", "server_cpu_seconds")


def peer_failed(error, keys, rounds, results, skipped, stopped):
    """A peer's rows `keys` (its first and second epoch) after `error`: those with rounds measured keep them
    and go into stopped, with why; the others into skipped ("not run"), out of results."""
    last = (str(error).strip().splitlines() or [""])[-1]  # a worker's traceback ends with the cause
    why = f"failed against this server: {type(error).__name__}: {last[:400]}"
    for k in keys:
        if results["rates"][k]:
            stopped[k] = f"measured in {len(results['rates'][k])} of {rounds} rounds, then {why}"
            continue
        skipped[k] = f"not run: {why}"
        for m in METRICS:
            results[m].pop(k, None)


def measure(args, out, proxies, stores, names, shards, total, work, results, skipped, stopped, corpus):
    """Runs every row args.rounds times into results; a peer that fails goes into skipped ("not run", why)
    or, after rounds it completed, into stopped (why), and is not run again."""
    rows, servers_of, peers = {}, {}, {}  # peers: each peer row's rows (both epochs)
    for (store, rtt), proxy in proxies.items():
        port = proxy.port if proxy else stores[store][0]
        base = f"http://127.0.0.1:{port}"
        label = f"{store} {rtt:g} ms"
        running = [stores[store][2]] + ([proxy] if proxy else [])
        if store == "http":
            urls, options = [f"{base}/{n}" for n in names], {}
            rows[f"{label}: webdataset + WebLoader"] = lambda u=list(urls): webdataset_pass(u, args)
        else:
            s3 = stores[store][1]
            urls, options = [f"s3://bench/shards/{n}" for n in names], s3.options(endpoint_url=base)
            for name, peer in PEERS.items() if rtt == args.rtt_ms else ():
                try:
                    made = peer_rows(label, name, peer, *corpus, s3, base, work, args)
                    rows.update(made)
                    peers.update((k, list(made)) for k in made)
                except Exception as e:  # not installed, or it cannot use this server: said, not dropped
                    skipped[f"{label}: {name}"] = f"not run: {type(e).__name__}: {e}"
            skipped[f"{label}: webdataset + WebLoader"] = (
                "not run: webdataset has no S3 client (it pipes `aws s3 cp`, not installed, or curl over presigned "
                "URLs, which moto's server answers with HTTP 500 when it checks signatures)")
        tag = f"{store.replace(' ', '-')}-{rtt:g}"
        cache, index = os.path.join(work, f"cache-{tag}"), os.path.join(work, f"index-{tag}")
        rows[f"{label}: fastpipe first time"] = lambda u=urls, o=options, d=cache, i=index: (
            emptied(d, i), fastpipe_pass(u, args, d, o, i))[1]
        rows[f"{label}: fastpipe cold"] = lambda u=urls, o=options, d=cache, i=index: (
            emptied(d), fastpipe_pass(u, args, d, o, i))[1]
        rows[f"{label}: fastpipe warm"] = lambda u=urls, o=options, d=cache, i=index: fastpipe_pass(u, args, d, o, i)
        rows[f"{label}: fastpipe stream (cache_limit shards/2), 2nd epoch"] = \
            lambda u=urls, o=options, d=cache, i=index: (emptied(d), fastpipe_pass(u, args, d, o, i, limit=total // 2,
                                                                                epochs=2))[1]
        if store == "http" and rtt == args.rtt_ms and args.threads > 1:
            fewer = argparse.Namespace(**dict(vars(args), threads=args.threads - 1))
            spare = f"{label}, {fewer.threads} reader thread{'s' if fewer.threads > 1 else ''}"
            rows[f"{spare}: fastpipe cold"] = lambda u=urls, o=options, d=cache, i=index: (
                emptied(d), fastpipe_pass(u, fewer, d, o, i))[1]
            rows[f"{spare}: fastpipe warm"] = lambda u=urls, o=options, d=cache, i=index: fastpipe_pass(u, fewer, d, o, i)
        servers_of.update((key, running) for key in rows if key.split(":")[0].startswith(label))
    rows["local: fastpipe"] = lambda: fastpipe_pass(shards, args, index=os.path.join(work, "index-local"))
    for key in rows:
        for m in METRICS:
            results[m][key] = []
    for r in range(args.rounds):
        for key, run in rows.items():
            if key in skipped or key in stopped:  # a peer that failed in an earlier round
                continue
            cpu = sum(p.cpu_seconds() for p in servers_of.get(key, []))
            try:
                measured = run()
            except Exception as e:
                if key not in peers:
                    raise
                peer_failed(e, peers[key], args.rounds, results, skipped, stopped)
                continue
            measured += (sum(p.cpu_seconds() for p in servers_of.get(key, [])) - cpu,)
            for m, v in zip(METRICS, measured):
                results[m][key].append(v)
            rate, after, first, got, servers_cpu = measured
            out.log(f"round {r + 1}/{args.rounds} {key}: {rate:.0f} images/s ({after:.0f} after the first batch), "
                    f"first batch {first:.2f} s" + (f", fetched {got / total:.3f}x the shards" if got is not None else "")
                    + f", servers' CPU {servers_cpu:.1f} s")


def add_arguments(p):
    g = p.add_argument_group("remote suite")
    g.add_argument("--images", type=int, default=2000, help="JPEGs in the corpus (default: %(default)s)")
    g.add_argument("--per-shard", type=int, default=250, help="samples a shard (default: %(default)s)")
    g.add_argument("--size", type=int, default=224, help="crop size (default: %(default)s)")
    g.add_argument("--batch-size", type=int, default=64)
    g.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="fastpipe's reader threads and every peer's workers (default: the cores)")
    g.add_argument("--rounds", type=int, default=3)
    g.add_argument("--rtt-ms", type=float, default=20.0, help="the delaying proxy's round trip (default: %(default)s)")
    g.add_argument("--no-direct", action="store_true", help="only the rows through the proxy (no 0 ms rows)")
    g.add_argument("--window", default="96MiB", help="fastpipe's shuffle_window, a few shards (default: %(default)s)")


def run(args, out):
    if args.quick:
        args.images, args.per_shard, args.rounds, args.window = 240, 60, 1, "4MiB"
    corpus_paths_, shards = corpus_shards(args.data_dir, args.images, args.per_shard, args.threads, out)
    corpus = images_of(corpus_paths_.tree)
    folder = os.path.dirname(shards[0])
    names = [os.path.basename(s) for s in shards]
    total = sum(os.path.getsize(s) for s in shards)
    work = tempfile.mkdtemp(prefix="fastpipe-remote-bench-")
    results, skipped, stopped = {m: {} for m in METRICS}, {}, {}
    try:
        with servers.Nginx(folder, os.path.join(work, "nginx")) as nginx, servers.MotoS3() as s3, \
                servers.NginxS3(os.path.join(work, "nginx-s3")) as nginx_s3:
            for name, path in zip(names, shards):
                with open(path, "rb") as f:
                    data = f.read()
                for store in (s3, nginx_s3):
                    store.put("bench", f"shards/{name}", data)
            stores = {"http": (nginx.port, None, nginx), "s3": (s3.port, s3, s3),
                      "s3 via nginx": (nginx_s3.port, nginx_s3, nginx_s3)}
            proxies = {}
            try:
                for store, (port, _, _) in stores.items():
                    if not args.no_direct:
                        proxies[(store, 0.0)] = None
                    proxies[(store, args.rtt_ms)] = servers.DelayProxy(port, args.rtt_ms)
                measure(args, out, proxies, stores, names, shards, total, work, results, skipped, stopped, corpus)
            finally:
                for proxy in proxies.values():
                    if proxy:
                        proxy.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = []
    rates, after = results["rates"], results["rates_after_first_batch"]

    def vs(v, base):
        return f"{statistics.median(a / b for a, b in zip(v, base)):.2f}x" if base else ""

    for key, v in rates.items():
        warm = key.split(":")[0] + ": fastpipe warm"
        got = [g for g in results["fetched"][key] if g is not None]
        table.append([key, f"{statistics.median(v):.0f}", vs(v, rates["local: fastpipe"]), vs(v, rates.get(warm)),
                      f"{statistics.median(after[key]):.0f}", vs(after[key], after.get(warm)),
                      f"{statistics.median(results['first_batch'][key]):.2f}",
                      f"{statistics.median(got) / total:.3f}" if got else "-",
                      "-" if key.startswith("local") else f"{statistics.median(results['server_cpu_seconds'][key]):.1f}"])
    table += [[key, "not run", "", "", "", "", "", "", ""] for key in skipped]
    out.table(["row", "images/s (median)", "x fastpipe local", "x fastpipe warm", "after the first batch: images/s",
               "x fastpipe warm", "first batch s", "fetched / shards", "servers' CPU s"],
              table, title=f"{args.images} JPEGs in {len(shards)} shards ({total / 2**20:.0f} MiB), {args.size}x{args.size}, "
                           f"batch {args.batch_size}, k={args.threads}, shuffle_window {args.window}, {args.rounds} rounds, "
                           f"servers on 127.0.0.1; ratios: medians of same-round ratios")
    for key, why in {**stopped, **skipped}.items():
        out.note(f"- {key}: {why}")  # in the results' tables too: a row not run, or not every round, says why
    return {**results, "not_run": skipped, "stopped": stopped, "shard_bytes": total, "torch": torch.__version__}
