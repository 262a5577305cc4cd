"""Loader with num_threads unset (CPU batches): reader threads, paused while the training step keeps the
cores busy, and next() reading the batches on torch's threads meanwhile (issue 21;
csrc/core/gather_policy.h). The choice follows the step, either way round, and the batches are the same
bytes whoever reads them, across any sequence of switches."""

import os

import pytest
import torch
from steps import Feed, busy_step, sleeping_step

CORES = len(os.sched_getaffinity(0))


@pytest.fixture
def torch_on_every_core():
    """torch's intra-op team as large as the cores (torch may default to fewer, e.g. physical cores)."""
    old = torch.get_num_threads()
    torch.set_num_threads(CORES)
    yield
    torch.set_num_threads(old)


def test_the_step_decides_where_batches_are_read(dataset_factory, fp, torch_on_every_core):
    ds, arrays, _ = dataset_factory(2999, {"x": ("uint8", (3, 16, 17)), "y": ("float32", (5,))})
    ld = fp.loader(ds, 16, shuffle=True, seed=3)
    feed = Feed(fp, ld, arrays)

    # A step that leaves the cores idle (a GPU step): the readers read ahead, next() reads nothing.
    s = feed.until(sleeping_step, lambda s: s["step_cores"] is not None, 200)
    for _ in range(40):
        s = feed.take(sleeping_step)
    assert s["next_batches"] == 0 and not s["gathering_in_next"], s
    assert s["step_cores"] < CORES - 0.5, s

    # A step whose torch ops keep every core busy: the readers would only take cores from it.
    s = feed.until(busy_step, lambda s: s["gathering_in_next"], 300)
    assert s["step_cores"] >= CORES - 0.5, s
    before = s["next_batches"]
    s = feed.until(busy_step, lambda s: s["next_batches"] > before, 60)  # after the batches read ahead

    # Back to an idle step: the readers are tried again (a window) and kept.
    s = feed.until(sleeping_step, lambda s: not s["gathering_in_next"] and s["step_cores"] < CORES - 0.5, 800)
    for _ in range(30):  # nothing read in next() was left behind
        feed.take(sleeping_step)
    resumed = ld.stats()["next_batches"]
    for _ in range(40):
        s = feed.take(sleeping_step)
    assert s["next_batches"] == resumed and not s["gathering_in_next"], s
    assert s["num_threads"] >= 1 and s["waits"] <= s["batches"], s
    ld.close()  # its reader threads end now, not when the garbage collector breaks the iterator's cycle


@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_are_exact_across_switches(dataset_factory, fp, rng, torch_on_every_core, drop_last):
    # Awkward sizes: 7-record batches of 2 columns, 3 epochs (one abandoned midway) with the reader
    # threads paused and resumed at random batches, kept off the training thread's core or not, some
    # batches held while later ones are read.
    ds, arrays, _ = dataset_factory(401, {"x": ("uint8", (3, 5, 7)), "y": ("float64", (3,))})
    ref = fp.loader(ds, 7, shuffle=True, seed=9, drop_last=drop_last, num_threads=2)
    want = []
    for e in range(3):
        ref.set_epoch(e)
        want.append(fp.epoch(ref))
    ld = fp.loader(ds, 7, shuffle=True, seed=9, drop_last=drop_last)
    fp.hooks(ld, poison=True)  # a slot refilled under a held batch shows as 0xA5
    # Runs of batches each way, next() first: the batches read ahead (prefetch <= 16) must run out before
    # next() reads; then threads or the policy (-1).
    mode, left = 1, int(rng.integers(20, 40))
    for e in range(3):
        ld.set_epoch(e)
        got, held = [], []
        for k, b in enumerate(ld):
            if left == 0:
                mode, left = (int(rng.integers(-1, 1)) if mode == 1 else 1), int(rng.integers(1, 40))
                ld._reader._force_spare_core(int(rng.integers(-1, 2)))  # the readers' cores, too
            ld._reader._force_gather_in_next(mode)
            left -= 1
            got.append(fp.to_np(b))
            held = (held + [b])[-3:]
            if e == 1 and k == 20:
                break
        del b, held
        assert fp.same_batches(want[e][:len(got)], got), f"epoch {e}"
    s = ld.stats()
    assert 0 < s["next_batches"] < s["batches"], s
    ld.close()
    ref.close()


def test_reader_threads_asked_for_are_kept(dataset_factory, fp, torch_on_every_core):
    ds, arrays, _ = dataset_factory(1000, {"x": ("uint8", (40,))})
    ld = fp.loader(ds, 8, shuffle=True, num_threads=2)
    feed = Feed(fp, ld, arrays)
    for _ in range(80):
        s = feed.take(busy_step)
    assert s["next_batches"] == 0 and not s["gathering_in_next"] and s["step_cores"] is None, s
    ld.close()
    # DataLoader's num_workers sets the reader threads; where the batches are read stays automatic.
    ld = fp.loader(ds, 8, shuffle=True, num_workers=2)
    s = Feed(fp, ld, arrays).until(busy_step, lambda s: s["gathering_in_next"], 300)
    assert s["num_threads"] == 2, s
    ld.close()
    ld = fp.loader(ds, 8, shuffle=True, num_threads=0)
    s = Feed(fp, ld, arrays).take(sleeping_step)
    assert s["gathering_in_next"] and s["next_batches"] == s["batches"] == 1 and s["step_cores"] is None, s
    ld.close()
