"""Batch lifetime, slots, early break, close/delete (threads, fds, slots back to baseline), fork, exit.

Thread counts come from /proc/self/task and fd counts from /proc/self/fd. The timeout method is
"thread" so that a hang inside C++ still ends the run with every stack dumped.
"""

import ctypes
import gc
import hashlib
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch

import fastpipe

pytestmark = pytest.mark.timeout(60, method="thread")


def digest(batch):
    h = hashlib.sha256()
    for k in sorted(batch):
        h.update(batch[k].numpy().tobytes())
    return h.hexdigest()


def check_live(batch, arrays):
    idx = batch["idx"].numpy()
    for name, ref in arrays.items():
        assert batch[name].numpy().tobytes() == ref[idx].tobytes(), f"column {name} changed"


# ---------------------------------------------------------------- holding batches


@pytest.mark.parametrize("poison", [False, True])
def test_holding_every_slot_with_when_full_error_raises_at_once(dataset_factory, fp, poison):
    """Nothing can be read until a slot is freed, so the loader says so at once: were it waiting, the
    error would come after the 30 s timeout and say the storage is stalled."""
    n, b = 400, 10
    ds, arrays, _ = dataset_factory(n, {"x": ("float32", (13,))})
    ld = fp.hooks(fp.loader(ds, b, prefetch=1, when_full="error"), poison=poison)
    assert ld.stats()["num_slots"] == 3
    it = iter(ld)
    held = [next(it) for _ in range(3)]  # every slot
    sums = [digest(h) for h in held]
    with pytest.raises(TimeoutError) as t_err:
        next(it)
    assert ld.stats()["waits"] == 0 or "still being read" not in str(t_err.value)
    msg = str(t_err.value)
    print(msg)
    assert "all 3 arena slots are held" in msg, f"the message should say how many batches are held: {msg}"
    assert "prefetch" in msg and "clone" in msg and "when_full='allocate'" in msg, f"the remedies: {msg}"
    assert ld.stats()["slots_leased"] == 3
    for h, s in zip(held, sums, strict=True):
        assert digest(h) == s, "a held batch changed while the loader waited"
        check_live(h, arrays)
    del h
    # release one: iteration continues with the very next batch, nothing skipped
    del held[0]
    gc.collect()
    nxt = next(it)
    assert nxt["idx"].numpy().tolist() == list(range(30, 40))
    check_live(nxt, arrays)
    for h, s in zip(held, sums[1:], strict=True):
        assert digest(h) == s
    del nxt, h
    held.clear()
    rest = fp.epoch(it)
    idx = fp.verify(rest, arrays)
    assert idx.tolist() == list(range(40, n))
    assert ld.stats()["slots_leased"] == 0


def test_timeout_error_repeats_then_recovers(dataset_factory, fp):
    ds, arrays, _ = dataset_factory(100, {"x": ("uint8", (5,))})
    ld = fp.loader(ds, 10, prefetch=1)
    it = iter(ld)
    first = fp.take(it, 3)
    fp.hooks(ld, hold_reads=True)  # the reads not yet started stall
    ld.timeout = 0.3
    # Batches read before the hold still arrive (how many depends on the readers' timing); then next()
    # times out, and again.
    with pytest.raises(TimeoutError, match="still being read"):
        for _ in range(len(ld)):
            first += fp.take(it, 1)
    assert len(first) < len(ld)
    with pytest.raises(TimeoutError, match="still being read"):
        next(it)
    ld.timeout = fp.LOADER_TIMEOUT
    fp.release(ld)
    rest = fp.epoch(it)
    assert fp.verify(first + rest, arrays).tolist() == list(range(100))


@pytest.mark.parametrize("io", ["mmap", "pread"])
def test_holding_every_batch_allocates_outside_the_arena(dataset_factory, fp, io):
    """DataLoader idioms that keep every batch: list(loader), torch.cat over an epoch. The arena stays
    fixed; the batches beyond it are read into memory torch frees, with one warning."""
    n, b = 203, 10
    ds, arrays, _ = dataset_factory(n, {"x": ("float32", (13,)), "label": ("int64", ())})
    ld = fp.hooks(fp.loader(ds, b, shuffle=True, prefetch=1, io=io), poison=True)
    arena = ld.stats()["arena_bytes"]
    with pytest.warns(UserWarning, match="holds every one of the 3 arena slots") as caught:
        batches = list(ld)
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert len(batches) == 21 and ld.stats()["overflow_batches"] == 18
    assert ld.stats()["arena_bytes"] == arena, "the arena grew"
    held = [fp.to_np(x) for x in batches]
    assert sorted(fp.verify(held, arrays).tolist()) == list(range(n))
    labels = torch.cat([x["label"] for x in ld])  # a second epoch the same way
    assert sorted(labels.tolist()) == list(range(n)) or sorted(labels.tolist()) == sorted(arrays["label"].tolist())
    assert fp.same_batches(held, [fp.to_np(x) for x in batches]), "a held batch changed"
    del batches
    gc.collect()
    assert ld.stats()["slots_leased"] == 0


@pytest.mark.parametrize(
    "alias",
    ["numpy", "slice-view", "reshape-view", "as_strided", "torch.as_tensor", "element"],
)
def test_released_slot_recycled_only_after_the_last_alias(dataset_factory, fp, alias):
    """With poison on, a released slot is filled with 0xA5: an alias of a released-but-held batch
    would show it. Each alias must keep its batch's slot alive through many more batches."""
    n, b = 300, 10
    ds, arrays, _ = dataset_factory(n, {"x": ("int32", (7,))})
    ld = fp.hooks(fp.loader(ds, b, shuffle=True, seed=3, prefetch=1), poison=True)
    it = iter(ld)
    batch = next(it)
    idx = batch["idx"].numpy().copy()
    x = batch["x"]
    ref = arrays["x"][idx]
    if alias == "numpy":
        keep, want = x.numpy(), ref
    elif alias == "slice-view":
        keep, want = x[2:5, 1:], ref[2:5, 1:]
    elif alias == "reshape-view":
        keep, want = x.view(-1), ref.reshape(-1)
    elif alias == "as_strided":
        keep, want = x.as_strided((3,), (7,)), ref[:3, 0]
    elif alias == "torch.as_tensor":
        keep, want = torch.as_tensor(x.numpy()), ref
    else:
        keep, want = x[4, 3], ref[4, 3]
    del batch, x
    gc.collect()
    # drive the loader through every slot several times; with 3 slots the held one must be skipped
    for _ in range(12):
        nb = next(it)
        del nb
    got = keep.numpy() if isinstance(keep, torch.Tensor) else keep
    assert np.asarray(got).tobytes() == np.ascontiguousarray(want).tobytes(), (
        "a slot was recycled while an alias of its batch was alive"
    )
    assert ld.stats()["slots_leased"] == 1
    del keep, got
    gc.collect()
    assert ld.stats()["slots_leased"] == 0


def test_poison_really_overwrites_released_slots(dataset_factory, fp):
    """Control for the test above: once every alias is gone the slot memory does change (read through a
    raw pointer while the loader, and so the arena, is alive)."""
    ds, arrays, _ = dataset_factory(200, {"x": ("uint8", (64,))})
    ld = fp.hooks(fp.loader(ds, 10, prefetch=1), poison=True)
    it = iter(ld)
    batch = next(it)
    ptr, nbytes = batch["x"].data_ptr(), batch["x"].numel()
    before = ctypes.string_at(ptr, nbytes)
    assert before == arrays["x"][:10].tobytes()
    del batch
    gc.collect()
    # The next 3 batches held: with 3 slots one of them must be the released one (released batches in
    # between could take turns in the other slots and leave it untouched, as one loaded run did).
    held = [next(it) for _ in range(3)]
    assert ctypes.string_at(ptr, nbytes) != before, "a released slot was neither poisoned nor reused"
    del held


def test_slots_leased_counts_held_batches(dataset_factory, fp):
    ds, _, _ = dataset_factory(100, {})
    ld = fp.loader(ds, 10, prefetch=2)
    it = iter(ld)
    a = next(it)
    b = next(it)
    assert ld.stats()["slots_leased"] == 2
    del a
    gc.collect()
    assert ld.stats()["slots_leased"] == 1
    del b
    gc.collect()
    assert ld.stats()["slots_leased"] == 0


def test_batch_outlives_loader(dataset_factory, fp, torch_warm):
    ds, arrays, _ = dataset_factory(100, {"x": ("float64", (3, 5, 7))})
    base_threads, base_fds = fp.count_threads(), fp.count_fds()
    ld = fp.loader(ds, 10, shuffle=True, num_threads=3)
    it = iter(ld)
    batch = next(it)
    alias = batch["x"][3:].numpy()
    want = arrays["x"][batch["idx"].numpy()[3:]].copy()
    del it, ld
    gc.collect()
    # threads and files go even though a batch is still held
    assert fp.wait_until(lambda: fp.count_threads() <= base_threads), (fp.count_threads(), base_threads)
    assert fp.wait_until(lambda: fp.count_fds() <= base_fds), (fp.count_fds(), base_fds)
    check_live(batch, arrays)
    del batch
    gc.collect()
    assert alias.tobytes() == want.tobytes()
    del alias
    gc.collect()


def test_close_keeps_held_batches(dataset_factory, fp, torch_warm):
    ds, arrays, _ = dataset_factory(100, {"x": ("int16", (4,))})
    base_threads, base_fds = fp.count_threads(), fp.count_fds()
    ld = fp.loader(ds, 10, num_threads=2)
    it = iter(ld)
    held = [next(it), next(it)]
    ld.close()
    assert fp.wait_until(lambda: fp.count_threads() <= base_threads), (fp.count_threads(), base_threads)
    assert fp.count_fds() <= base_fds, "close() left files open"
    for h in held:
        check_live(h, arrays)
    with pytest.raises(RuntimeError):
        next(it)
    with pytest.raises(RuntimeError):
        iter(ld)
    with pytest.raises(RuntimeError):
        for _ in ld:
            pass
    ld.close()  # closing twice is harmless


# ---------------------------------------------------------------- baselines


@pytest.mark.parametrize("io", ["mmap", "pread", "auto"])
def test_early_break_then_delete_returns_to_baseline(dataset_factory, fp, torch_warm, io):
    ds, arrays, _ = dataset_factory(500, {"x": ("uint8", (100,)), "y": ("float32", ())})
    gc.collect()
    base_threads, base_fds = fp.count_threads(), fp.count_fds()
    ld = fp.quiet_loader(ds, 8, shuffle=True, num_threads=4, io=io)
    n = 0
    for batch in ld:
        n += 1
        if n == 1:
            during = fp.count_threads()
        if n == 3:
            break
    assert during > base_threads, "no reader thread seen while iterating (is the baseline measured right?)"
    assert fp.count_fds() > base_fds or io != "pread", "no file open while iterating with pread"
    # a new pass after the break restarts cleanly
    idx = fp.verify(fp.epoch(ld), arrays)
    assert sorted(idx.tolist()) == list(range(500))
    for batch in ld:
        break
    del batch
    del ld
    gc.collect()
    assert fp.wait_until(lambda: fp.count_threads() <= base_threads), (
        f"threads {fp.count_threads()} > baseline {base_threads}"
    )
    assert fp.wait_until(lambda: fp.count_fds() <= base_fds), f"fds {fp.count_fds()} > baseline {base_fds}"


def test_many_loaders_do_not_accumulate(dataset_factory, fp, torch_warm):
    ds, _, _ = dataset_factory(200, {"x": ("uint8", (16,))})
    gc.collect()
    base_threads, base_fds = fp.count_threads(), fp.count_fds()
    for i in range(30):
        ld = fp.loader(ds, 16, shuffle=True, num_threads=2)
        it = iter(ld)
        next(it)
        if i % 3 == 0:
            ld.close()
        del it, ld
    gc.collect()
    assert fp.wait_until(lambda: fp.count_threads() <= base_threads), (fp.count_threads(), base_threads)
    assert fp.wait_until(lambda: fp.count_fds() <= base_fds), (fp.count_fds(), base_fds)


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_long_run_stays_flat(dataset_factory, fp, torch_warm):
    ds, arrays, _ = dataset_factory(1_000, {"x": ("uint8", (32,))})
    ld = fp.loader(ds, 4, shuffle=True, num_threads=2)
    fp.epoch(ld)
    gc.collect()
    threads, fds = fp.count_threads(), fp.count_fds()
    objects, rss = len(gc.get_objects()), _rss_bytes()
    for _ in range(8):  # 2,000 batches
        idx = []
        for b in ld:
            idx.append(b["idx"].numpy().copy())
            del b
        assert sorted(np.concatenate(idx).tolist()) == list(range(1_000))
    gc.collect()
    st = ld.stats()
    assert st["slots_leased"] == 0
    assert fp.count_threads() <= threads and fp.count_fds() <= fds
    grown = len(gc.get_objects()) - objects
    assert grown < 1_000, f"{grown} more Python objects after 2,000 batches: something leaks per batch"
    assert _rss_bytes() - rss < 32 << 20, "resident memory grew by more than 32 MiB over 2,000 batches"


# ---------------------------------------------------------------- stalls and interrupts


def test_stalled_read_timeout_then_prompt_close(dataset_factory, fp, torch_warm):
    """A read that never ends: next() gives up after its timeout, and close() does not wait for it."""
    ds, _, _ = dataset_factory(64, {"x": ("float32", (4,))})
    base_threads = fp.count_threads()
    ld = fp.hooks(fp.loader(ds, 8, num_threads=2, timeout=0.5), hold_reads=True)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="batch 0 of this epoch is still being read .* storage may be stalled"):
        next(iter(ld))
    assert time.monotonic() - t0 >= 0.5, "next() gave up before its timeout"
    assert fp.held_reads(ld) >= 1, "no read was stalled: the test proves nothing"
    fp.finishes(ld.close, "close() with a stalled read")  # the read is never released
    assert fp.wait_until(lambda: fp.count_threads() <= base_threads)


def test_delete_while_reads_stall(dataset_factory, fp, torch_warm):
    ds, _, _ = dataset_factory(64, {"x": ("float32", (4,))})
    base_threads = fp.count_threads()
    ld = fp.hooks(fp.loader(ds, 8, num_threads=2, timeout=None), hold_reads=True)
    it = iter(ld)
    assert fp.wait_until(lambda: fp.held_reads(ld) == 2), "the readers never reached the stalled read"

    def delete():
        nonlocal it, ld
        del it, ld
        gc.collect()

    fp.finishes(delete, "deleting a loader whose reads stall")
    assert fp.wait_until(lambda: fp.count_threads() <= base_threads)


def next_while_waiting(fp, ld, it, then):
    """next(it) in this thread; once it waits for data (the reader counts the wait), another thread
    runs then(). Returns next's result."""
    waits = ld.stats()["waits"]
    helper = threading.Thread(target=lambda: fp.wait_until(lambda: ld.stats()["waits"] > waits) and then(),
                              daemon=True)
    helper.start()
    try:
        return next(it)
    finally:
        helper.join(fp.HANG)


@pytest.mark.parametrize("timeout", [None, 0])
def test_timeout_none_or_zero_waits_forever(dataset_factory, fp, timeout):
    """timeout=None or 0 means no limit (0 is DataLoader's default), not "give up at once": next() is
    still waiting when the stalled read is released, then returns the batch."""
    ds, arrays, _ = dataset_factory(16, {"x": ("float32", (4,))})
    ld = fp.hooks(fp.loader(ds, 8, num_threads=1, timeout=timeout), hold_reads=True)
    it = iter(ld)
    first = fp.to_np(next_while_waiting(fp, ld, it, lambda: fp.release(ld)))
    assert ld.stats()["waits"] >= 1
    batches = [first] + fp.epoch(it)
    assert fp.verify(batches, arrays).tolist() == list(range(16))
    ld.close()


class _Interrupt(Exception):
    pass


def interrupt_main_thread():
    signal.pthread_kill(threading.main_thread().ident, signal.SIGALRM)


def test_signal_interrupts_a_waiting_next(dataset_factory, fp):
    """A Python signal handler (like Ctrl-C) runs while next() waits for data, and its exception escapes."""
    ds, _, _ = dataset_factory(64, {"x": ("float32", (4,))})
    ld = fp.hooks(fp.loader(ds, 8, timeout=None), hold_reads=True)

    def handler(signum, frame):
        raise _Interrupt()

    old = signal.signal(signal.SIGALRM, handler)
    try:
        it = iter(ld)
        with pytest.raises(_Interrupt):  # the read is never released: only the signal can end the wait
            next_while_waiting(fp, ld, it, interrupt_main_thread)
    finally:
        signal.signal(signal.SIGALRM, old)
    fp.finishes(ld.close, "close() after an interrupted next()")


def test_interrupted_next_can_be_retried(dataset_factory, fp):
    """After an exception from a signal handler escapes a waiting next(), the same iterator goes on
    with the batch it was waiting for (nothing skipped, nothing duplicated)."""
    ds, arrays, _ = dataset_factory(16, {"x": ("float32", (4,))})
    ld = fp.hooks(fp.loader(ds, 8, num_threads=1, timeout=None), hold_reads=True)

    def handler(signum, frame):
        raise _Interrupt()

    it = iter(ld)
    old = signal.signal(signal.SIGALRM, handler)
    try:
        with pytest.raises(_Interrupt):
            next_while_waiting(fp, ld, it, interrupt_main_thread)
    finally:
        signal.signal(signal.SIGALRM, old)
    fp.release(ld)
    rest = fp.epoch(it)
    assert fp.verify(rest, arrays).tolist() == list(range(16))
    ld.close()


# ---------------------------------------------------------------- fork and exit


def _wait_child(pid, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def _fork_child(report, body):
    """Forks a child that runs body() -> (message, exit code), writes the message to `report` and exits;
    returns its pid."""
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 1
        try:
            try:
                msg, code = body()
            except BaseException as e:  # noqa: BLE001
                msg, code = f"{type(e).__name__}: {e}", 2
            with open(report, "w") as f:
                f.write(msg)
        finally:
            os._exit(code)
    return pid


def _child_result(pid, report):
    """(exit code, report) of a child from _fork_child; the code is None when it hung (killed)."""
    code = _wait_child(pid, 60)
    return code, report.read_text() if report.exists() else "(no report)"


@pytest.mark.parametrize("child_threads", [2, None])
def test_fork_while_readers_run(dataset_factory, fp, tmp_path, child_threads):
    """fork() with reader threads running: in the child a new Loader reads an exact epoch, while the
    parent's loader keeps working. None: the child's loader chooses where to read (its readers register
    with the step-CPU measurement, whose lock a fork must not leave held)."""
    ds, arrays, paths = dataset_factory(600, {"x": ("uint8", (40,))})
    ld = fp.loader(ds, 8, shuffle=True, seed=1, num_threads=4)
    it = iter(ld)
    first = fp.to_np(next(it))

    def body():
        cl = fp.loader(fastpipe.NpyDataset(paths), 16, shuffle=True, seed=2, num_threads=child_threads)
        seen = fp.verify(fp.epoch(cl), arrays)
        cl.close()
        return ("ok", 0) if sorted(seen.tolist()) == list(range(600)) else ("wrong records", 1)

    pid = _fork_child(tmp_path / "child.txt", body)
    rest = fp.epoch(it)  # the parent keeps going while the child works
    assert sorted(fp.verify([first] + rest, arrays).tolist()) == list(range(600))
    code, info = _child_result(pid, tmp_path / "child.txt")
    print("child:", code, info)
    assert code == 0, f"child exit {code} (None: hung): {info}"


def test_fork_child_continuing_the_parents_iterator_gets_a_clear_error(dataset_factory, fp, tmp_path):
    """The parent's pass has no reader threads in a forked child: continuing it raises a RuntimeError
    that says why, at once (never a hang), and the parent goes on unharmed."""
    ds, arrays, _ = dataset_factory(300, {"x": ("uint8", (40,))})
    ld = fp.loader(ds, 8, num_threads=2)
    it = iter(ld)
    first = fp.to_np(next(it))

    def body():
        try:
            next(it)
        except RuntimeError as e:
            return str(e), 3 if "another process" in str(e) and "fork" in str(e) else 4
        return "next() worked on a pass whose readers stayed in the parent", 1

    code, info = _child_result(_fork_child(tmp_path / "child.txt", body), tmp_path / "child.txt")
    print("child:", code, info)
    assert code == 3, f"child exit {code}: {info}"
    assert sorted(fp.verify([first] + fp.epoch(it), arrays).tolist()) == list(range(300))


def test_fork_child_iterating_the_parents_loader(dataset_factory, fp, tmp_path):
    """iter() on the parent's loader in a forked child opens the child's own readers: its epoch (the
    loader's next, as in the parent) is byte-exact against numpy."""
    ds, arrays, _ = dataset_factory(300, {"x": ("uint8", (40,))})
    ld = fp.loader(ds, 8, shuffle=True, seed=4, num_threads=2)
    it = iter(ld)
    next(it)  # the parent's readers run during the fork
    want = [b["idx"].tolist() for b in fp.epoch(fp.loader(ds, 8, shuffle=True, seed=4))]  # epoch 0

    def body():
        reference = fp.loader(ds, 8, shuffle=True, seed=4)
        reference.set_epoch(1)
        order = [b["idx"].tolist() for b in fp.epoch(reference)]
        batches = fp.epoch(ld)  # epoch 1: the parent took epoch 0's iterator
        fp.verify(batches, arrays)
        ok = [b["idx"].tolist() for b in batches] == order and order != want
        return ("ok" if ok else "wrong order"), 0 if ok else 1

    code, info = _child_result(_fork_child(tmp_path / "child.txt", body), tmp_path / "child.txt")
    print("child:", code, info)
    assert code == 0, f"child exit {code}: {info}"
    fp.verify(fp.epoch(it), arrays)


def test_dataloader_workers_beside_fastpipe(dataset_factory, fp):
    """A torch DataLoader forking workers while fastpipe's readers run (a common mix)."""
    ds, arrays, _ = dataset_factory(400, {"x": ("float32", (8,))})
    ld = fp.loader(ds, 16, shuffle=True, num_threads=2)
    it = iter(ld)
    got = [fp.to_np(next(it))]
    tds = torch.utils.data.TensorDataset(torch.arange(64))
    dl = torch.utils.data.DataLoader(tds, batch_size=8, num_workers=2, multiprocessing_context="fork", timeout=30)
    total = sum(int(b[0].sum()) for b in dl)
    assert total == sum(range(64))
    got += fp.epoch(it)
    assert sorted(fp.verify(got, arrays).tolist()) == list(range(400))


EXIT_SCRIPT = r"""
import os, sys, time
import numpy as np
import fastpipe
work, scenario = sys.argv[1], sys.argv[2]
np.save(os.path.join(work, "x.npy"), np.arange(4000, dtype=np.float32).reshape(1000, 4))
ds = fastpipe.NpyDataset(os.path.join(work, "x.npy"))
if scenario == "held":
    ld = fastpipe.Loader(ds, 8, shuffle=True, num_threads=4)
    it = iter(ld)
    keep = [next(it), next(it)]
elif scenario == "stalled":
    ld = fastpipe.Loader(ds, 8, num_threads=2, timeout=None)
    ld._reader._hold_reads(True)  # a read that never ends (tests/conftest.py: hooks)
    it = iter(ld)
    while ld._reader._held_reads() < 2:
        time.sleep(0.005)
elif scenario == "fork-exit":
    ld = fastpipe.Loader(ds, 8, shuffle=True, num_threads=4)
    it = iter(ld)
    keep = next(it)
    pid = os.fork()
    if pid == 0:
        # a child that exits normally: atexit and garbage collection see the parent's loader
        sys.exit(0)
    _, status = os.waitpid(pid, 0)
    print("child status", os.waitstatus_to_exitcode(status))
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(5)
print("exiting", flush=True)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scenario", ["held", "stalled", "fork-exit"])
def test_process_exits_without_close(tmp_path, fp, scenario):
    """A loader never closed (mid-epoch, batches held, or a read stalled for ever) does not keep the
    process alive at exit and does not crash it; nor does a forked child that exits normally. Waiting
    for the stalled read would never end: run_python fails the test as a hang."""
    proc = fp.run_python(EXIT_SCRIPT, timeout=60, args=(tmp_path, scenario))
    assert proc.returncode == 0, fp.describe_exit(proc)
    assert "exiting" in proc.stdout


def test_abandoned_passes_never_leak_into_new_ones(dataset_factory, fp):
    """Break out right after the first batch many times while readers are still filling slots: every
    first batch of every new pass is right, and held batches of old passes never change."""
    ds, arrays, _ = dataset_factory(2_000, {"x": ("uint8", (200,))})
    ld = fp.hooks(fp.loader(ds, 64, shuffle=True, seed=5, num_threads=4, prefetch=3), poison=True)
    keep = None
    for r in range(40):
        it = iter(ld)
        b = next(it)
        check_live(b, arrays)
        if r == 5:
            keep, keep_sum = b, digest(b)
        del b, it
    assert digest(keep) == keep_sum, "a batch held from an abandoned pass changed"
    check_live(keep, arrays)
    got = fp.epoch(ld)
    assert sorted(fp.verify(got, arrays).tolist()) == list(range(2_000))
    assert digest(keep) == keep_sum
    del keep
    gc.collect()
    assert ld.stats()["slots_leased"] == 0


def test_held_batches_of_a_finished_epoch_survive_the_next(dataset_factory, fp):
    ds, arrays, _ = dataset_factory(120, {"x": ("int32", (9,))})
    ld = fp.hooks(fp.loader(ds, 10, shuffle=True, prefetch=1), poison=True)
    it = iter(ld)
    held = [next(it), next(it)]
    sums = [digest(h) for h in held]
    for b in it:  # the rest of epoch 0 through the one free slot
        check_live(b, arrays)
        del b
    got = fp.epoch(ld)  # all of epoch 1, still with two slots held
    assert sorted(fp.verify(got, arrays).tolist()) == list(range(120))
    assert [digest(h) for h in held] == sums
    for h in held:
        check_live(h, arrays)


def test_random_hold_and_release_model(dataset_factory, fp, rng):
    """Hold and release batches in a random order (never more than the slots allow): every batch is
    right when taken, still right when released, and the epoch is exact."""
    n, b = 900, 6
    ds, arrays, _ = dataset_factory(n, {"x": ("uint8", (33,)), "y": ("float64", (2,))})
    ld = fp.hooks(fp.loader(ds, b, shuffle=True, seed=8, prefetch=2, num_threads=3), poison=True)
    slots = ld.stats()["num_slots"]
    held = []
    seen = []
    for e in range(2):
        for batch in ld:
            check_live(batch, arrays)
            seen.append(batch["idx"].numpy().copy())
            held.append((batch, digest(batch)))
            del batch
            # keep at most slots - 1 so that the loader can always make progress
            while held and (len(held) >= slots or rng.random() < 0.5):
                k = int(rng.integers(len(held)))
                h, s = held.pop(k)
                assert digest(h) == s, "a held batch changed before its release"
                check_live(h, arrays)
                del h
        idx = np.concatenate(seen)
        assert sorted(idx.tolist()) == list(range(n)), f"epoch {e}"
        seen.clear()
    assert all(digest(h_) == s_ for h_, s_ in held)
    held.clear()
    gc.collect()
    assert ld.stats()["slots_leased"] == 0


def test_batches_released_and_consumed_on_other_threads(dataset_factory, fp):
    """A producer thread iterates (like a prefetch/pin thread); the main thread checks and drops the
    batches; a third thread polls stats(). No deadlock, no wrong bytes."""
    import queue

    ds, arrays, _ = dataset_factory(1_000, {"x": ("int16", (20,))})
    ld = fp.hooks(fp.loader(ds, 8, shuffle=True, seed=2, prefetch=2, num_threads=2), poison=True)
    q = queue.Queue(maxsize=2)
    stop = threading.Event()
    errors = []

    def produce():
        try:
            for _ in range(3):
                for batch in ld:
                    q.put(batch)
                    del batch
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            q.put(None)

    def poll_stats():
        while not stop.is_set():
            ld.stats()
            time.sleep(0.001)

    threads = [threading.Thread(target=produce, daemon=True), threading.Thread(target=poll_stats, daemon=True)]
    for t in threads:
        t.start()
    seen = []
    try:
        while True:
            batch = q.get(timeout=30)
            if batch is None:
                break
            check_live(batch, arrays)
            seen.append(batch["idx"].numpy().copy())
            del batch
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not errors, errors
    idx = np.concatenate(seen)
    assert len(idx) == 3_000
    assert all(sorted(idx[e * 1000:(e + 1) * 1000].tolist()) == list(range(1000)) for e in range(3))


def test_a_closed_loader_is_freed_at_once_with_its_iterator(dataset_factory, fp):
    """close() drops the loader's reference to its live iterator (which refers back to the loader), so
    dropping both frees the loader and its arena at once, not at some later garbage collection; and
    state_dict() after close() still reports where the pass was."""
    import weakref

    ds, _, _ = dataset_factory(64, {"x": ("uint8", (16,))})
    ld = fp.loader(ds, 4, shuffle=True)
    it = iter(ld)
    fp.take(it, 3)
    gc.disable()
    try:
        ld.close()
        assert (ld.state_dict()["epoch"], ld.state_dict()["batch"]) == (0, 3)
        ref = weakref.ref(ld)
        del ld, it
        assert ref() is None, "the closed loader waits for the garbage collector (a reference cycle)"
    finally:
        gc.enable()


@pytest.mark.parametrize("how", ["islice", "held_iterator", "unstarted", "finished"])
def test_a_dropped_loader_stops_its_readers_at_once(dataset_factory, fp, how):
    """The Loader refers to its pass weakly, so that dropping it (after an islice, a break, with its
    iterator, before the first batch) frees it and stops its reader threads then, not at some later
    garbage collection: that may come only at interpreter exit, with the readers still running. What a
    pass's end leaves (its position for state_dict(), an unstarted pass not counting as an epoch) stays."""
    import itertools
    import weakref

    ds, arrays, _ = dataset_factory(64, {"x": ("uint8", (16,))})

    def first_batch(loader=None, epoch=None):
        if loader is None:
            loader = fp.loader(ds, 4, shuffle=True)
            loader.set_epoch(epoch)
        return fp.take(iter(loader), 1)[0]["idx"].tolist()

    gc.collect()
    base_threads = fp.count_threads()
    ld = fp.loader(ds, 4, shuffle=True, num_threads=3)
    gc.disable()
    try:
        it = iter(ld)
        if how == "islice":
            del it
            for batch in itertools.islice(ld, 3):
                check_live(batch, arrays)
            del batch
            assert (ld.state_dict()["epoch"], ld.state_dict()["batch"]) == (0, 3)
            assert first_batch(ld) == first_batch(epoch=1), "a new iter() after a break is the next epoch"
        elif how == "held_iterator":
            fp.take(it, 5)
            assert (ld.state_dict()["epoch"], ld.state_dict()["batch"]) == (0, 5)
        elif how == "unstarted":
            del it
            assert first_batch(ld) == first_batch(epoch=0), "an iterator that read nothing is no epoch"
        else:
            assert len(fp.epoch(it)) == 16
            del it
            assert (ld.state_dict()["epoch"], ld.state_dict()["batch"]) == (1, 0)
        assert fp.count_threads() > base_threads, "no reader thread seen (is the baseline right?)"
        ref = weakref.ref(ld)
        del ld
        if how == "held_iterator":
            assert ref() is not None, "the iterator keeps its loader"
            del it
        assert ref() is None, "the dropped loader waits for the garbage collector (a reference cycle)"
        assert fp.wait_until(lambda: fp.count_threads() <= base_threads), (
            f"threads {fp.count_threads()} > baseline {base_threads}")
    finally:
        gc.enable()


def _used_and_dropped(kind, root, rng):
    """Makes a dataset of ``kind`` under ``root``, reads part of a pass from it and drops everything."""
    from jpegs import jpeg_bytes, make_tree, picture
    from tar_files import tar_bytes

    from fastpipe.transforms import RandomResizedCrop

    if kind in ("npy", "monitor"):
        np.save(root / "x.npy", rng.random((40, 3), dtype=np.float32))
        ds = fastpipe.NpyDataset({"x": str(root / "x.npy")})
    elif kind == "tokens":
        rng.integers(0, 1000, 3000, dtype=np.uint16).tofile(root / "tokens.bin")
        ds = fastpipe.TokenDataset(str(root / "tokens.bin"), block_size=16, dtype="uint16")
    elif kind in ("image_folder", "torchvision_folder"):
        make_tree(root / "images", rng, [(int(h), int(w)) for h, w in rng.integers(12, 40, (8, 2))])
        if kind == "image_folder":
            ds = fastpipe.ImageFolder(str(root / "images"), transform=RandomResizedCrop(16))
        else:
            import torchvision
            import torchvision.transforms as T

            ds = torchvision.datasets.ImageFolder(str(root / "images"), transform=T.Compose(
                [T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.ToTensor()]))
    else:
        members = []
        for i in range(8):
            members += [(f"s{i:03d}.jpg", jpeg_bytes(picture(rng, 20, 24))), (f"s{i:03d}.cls", b"1")]
        (root / "shard.tar").write_bytes(tar_bytes(members))
        ds = fastpipe.WebDataset([str(root / "shard.tar")], transform=RandomResizedCrop(16))
    loader = fastpipe.Loader(ds, batch_size=4, shuffle=True, num_threads=2, timeout=60)
    if kind == "monitor":
        with fastpipe.Monitor(loaders=[loader], interval=0.01) as mon:
            for _ in loader:
                mon.step()
        str(mon)
    else:
        it = iter(loader)
        next(it)


@pytest.mark.parametrize("kind", ["npy", "tokens", "image_folder", "torchvision_folder", "webdataset", "monitor"])
def test_nothing_fastpipe_makes_is_left_to_the_garbage_collector(tmp_path, rng, kind):
    """Datasets, the Loader, its pass and the Monitor are freed when the program drops them, by reference
    counting: in a reference cycle they would keep reader threads, files and arenas until a collection,
    which may come only at interpreter exit."""
    if kind == "torchvision_folder":
        pytest.importorskip("torchvision")
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        _used_and_dropped(kind, tmp_path, rng)
        gc.collect()
        left = sorted({type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("fastpipe")})
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
        gc.enable()
    assert not left, f"left in reference cycles: {left}"
