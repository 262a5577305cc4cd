"""Soak suite: a long run of the Loader (10,000 batches by default, over many epochs) with a resume from
a saved state in every epoch and batches held at random, sampling what must stay flat: resident memory,
open file descriptors, threads, leased arena slots and, on a CUDA loader, torch's allocated memory.
Every epoch is checked to hold each record exactly once across its resume. Prints the samples and, per
quantity, its growth from the first sample against the tolerance."""

import argparse
import os
import random

import numpy as np
import torch

from fastpipe.monitor import _rss_bytes

__all__ = ["add_arguments", "run", "soak", "TOLERANCE"]

RECORDS, BATCH = 2048, 32
# Growth allowed from the first sample (after one warm-up epoch) to any later one.
# cuda_mib is torch's allocator; device_mib the whole device's use (the driver's count), which also sees
# the loader's own device arenas, allocated outside torch (the H200 soak's cuda_mib stayed at 0.0).
TOLERANCE = {"rss_mib": 64.0, "fds": 0, "threads": 0, "cuda_mib": 16.0, "device_mib": 64.0}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batches", type=int, default=None, help="batches in all (default 10,000; quick 600)")
    p.add_argument("--device", default="cpu", help="the Loader's device: cpu or cuda")
    p.add_argument("--hold", type=float, default=0.05, help="probability of keeping a batch for a while")
    p.add_argument("--samples", type=int, default=20, help="how many times to sample along the run")
    p.add_argument("--seed", type=int, default=0)


def _sample(batch, epoch, loaders, device):
    return {
        "batch": batch,
        "epoch": epoch,
        "rss_mib": _rss_bytes() / 2**20,
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": len(os.listdir("/proc/self/task")),
        "slots_leased": sum(ld.stats()["slots_leased"] for ld in loaders),
        "cuda_mib": torch.cuda.memory_allocated(device) / 2**20 if device.startswith("cuda") else None,
        "device_mib": _device_used_bytes(device) / 2**20 if device.startswith("cuda") else None,
    }


def _device_used_bytes(device):
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def check_epoch(seen, epoch):
    """The indices of an epoch's batches hold every record exactly once."""
    order = np.sort(np.concatenate(seen))
    assert np.array_equal(order, np.arange(RECORDS)), f"epoch {epoch} did not hold every record once"


def soak(directory, batches=10_000, device="cpu", hold=0.05, samples=20, seed=0, progress=None):
    """Runs the soak; returns {"samples": [...], "growth": {...}, "ok": {...}, "epochs": n, "resumes": n}.
    Raises AssertionError if an epoch does not hold every record exactly once."""
    import fastpipe

    rng = random.Random(seed)
    os.makedirs(directory, exist_ok=True)
    paths = {"idx": os.path.join(directory, "idx.npy"), "x": os.path.join(directory, "x.npy")}
    np.save(paths["idx"], np.arange(RECORDS, dtype=np.int64))
    x = np.random.default_rng(seed).integers(0, 256, (RECORDS, 3, 32, 32), dtype=np.uint8)
    np.save(paths["x"], x)
    ds = fastpipe.NpyDataset(paths)

    def make():
        return fastpipe.Loader(ds, BATCH, shuffle=True, seed=seed, num_workers=2, device=device, timeout=60)

    loader, held, seen = make(), [], []
    every = max(1, batches // samples)
    rows, epochs, resumes = [], 0, 0
    done = 0
    bar = progress(total=batches, desc="soak", unit="batch") if progress else None
    warm = len(loader)  # one epoch before the first sample: arenas, page cache, lazy imports

    def consume(batches_of_pass, stop_at):
        """Checks and counts batches, keeping some; False when it stopped before the pass ended."""
        nonlocal done
        for k, b in enumerate(batches_of_pass, 1):
            idx = b["idx"].cpu().numpy().copy()  # a view would hold the batch's arena slot
            assert np.array_equal(b["x"].cpu().numpy(), x[idx]), f"batch {done}: bytes differ from the file"
            seen.append(idx)
            if rng.random() < hold:
                held.append(b)
            if held and rng.random() < 2 * hold:  # released at about the rate they are kept
                held.pop(rng.randrange(len(held)))
            del b
            done += 1
            if bar:
                bar.update()
            if done >= warm and (done - warm) % every == 0:
                rows.append(_sample(done, epochs, [loader], device))
            if k == stop_at or done >= batches:
                return False
        return True

    while done < batches:
        finished = consume(iter(loader), rng.randrange(1, len(loader)))
        if not finished and done < batches:  # save, drop the loader, resume the pass in a new one
            state = loader.state_dict()
            loader.close()
            loader = make()
            loader.load_state_dict(state)
            resumes += 1
            finished = consume(iter(loader), None)
        if finished:
            check_epoch(seen, epochs)
            seen, epochs = [], epochs + 1
    held.clear()
    loader.close()
    if bar:
        bar.close()
    rows.append(_sample(done, epochs, [], device))
    first = rows[0]
    growth = {q: max(r[q] for r in rows) - first[q] for q in TOLERANCE if first[q] is not None}
    ok = {q: growth[q] <= TOLERANCE[q] for q in growth}
    ok["slots_leased"] = rows[-1]["slots_leased"] == 0
    return {"samples": rows, "growth": growth, "ok": ok, "epochs": epochs, "resumes": resumes, "batches": done}


def run(args, out):
    batches = args.batches or (600 if args.quick else 10_000)
    result = soak(os.path.join(args.data_dir, "quick" if args.quick else "", "soak"), batches, args.device,
                  args.hold, args.samples, args.seed, out.progress)
    cols = ["batch", "epoch", "rss_mib", "fds", "threads", "slots_leased", "cuda_mib", "device_mib"]
    out.table(cols, [[r[c] if not isinstance(r[c], float) else f"{r[c]:.1f}" for c in cols] for r in result["samples"]],
              title=f"soak: {result['batches']} batches of {BATCH}, {result['epochs']} epochs, {result['resumes']} "
                    f"resumes, device {args.device}, batches held with probability {args.hold}")
    out.table(["quantity", "growth", "tolerance", "ok"],
              [[q, f"{g:.1f}", TOLERANCE[q], result["ok"][q]] for q, g in result["growth"].items()]
              + [["slots leased at the end", result["samples"][-1]["slots_leased"], 0, result["ok"]["slots_leased"]]],
              title="growth from the first sample (after one epoch)")
    verdict = "flat" if all(result["ok"].values()) else "GREW: " + ", ".join(q for q, v in result["ok"].items() if not v)
    out.note(f"soak: {verdict}; every epoch held each record exactly once")
    result["headline"] = [f"{result['batches']} batches, {result['resumes']} resumes: {verdict}"]
    return result
