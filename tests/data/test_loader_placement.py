"""Reader threads keep off the core the training loop takes its batches on while the other cores leave
them ample time, and take every core again once the loop waits for them (issue 21;
csrc/core/reader_placement.h). The batches stay exact whichever cores read them (also
test_loader_gather_auto.py's switches). When the readers keep off the core and when they take it back
(their demand, the waits, the holds of 64 to 512 batches) is CorePlacement's decision on a scripted clock,
checked in tests/core/reader_stress.cpp: a test here that timed a sleeping loop's CPU shares failed on a
loaded machine."""

import os
import threading
import time

import pytest

from steps import Feed

CORES = frozenset(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(len(CORES) < 2, reason="the readers keep off a core only where 2 are usable")


def reader_threads():
    """{thread id: the cores it may run on} of every fastpipe reader thread of this process."""
    out = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                if f.read().startswith("fastpipe-rd"):
                    out[int(task)] = frozenset(os.sched_getaffinity(int(task)))
        except OSError:  # it ended meanwhile
            continue
    return out


@pytest.fixture
def home_affinity():
    """The training thread's cores, restored after the test pins it."""
    home = os.sched_getaffinity(0)
    yield
    os.sched_setaffinity(0, home)


def test_reader_keeps_off_the_training_threads_core(dataset_factory, fp, home_affinity):
    ds, arrays, _ = dataset_factory(1001, {"x": ("uint8", (3, 9, 11)), "y": ("int64", ())})
    others = set(reader_threads())
    ld = fp.loader(ds, 13, shuffle=True, num_threads=1, prefetch=2)
    (mine,) = set(reader_threads()) - others
    core = max(CORES)
    os.sched_setaffinity(0, {core})  # the training thread, on one core
    feed = Feed(fp, ld, arrays)
    ld._reader._force_spare_core(1)
    # The one reader reads every batch (a step of 3 ms leaves it ahead: next() never waits, so never reads
    # a batch itself); those after the first few were dispatched once it was told.
    for _ in range(6):
        s = feed.take(lambda: time.sleep(0.003))
    assert reader_threads()[mine] == CORES - {core}
    assert s["spare_cpu"] == core and s["spared_batches"] == 6, s
    ld._reader._force_spare_core(0)
    for _ in range(6):
        s = feed.take(lambda: time.sleep(0.003))
    assert reader_threads()[mine] == CORES
    assert s["spare_cpu"] is None and s["spared_batches"] == 6, s
    ld.close()


def test_readers_beyond_the_cores_left_to_them_wait_while_they_keep_off_one(dataset_factory, fp):
    """Readers kept off the training thread's core have one core fewer: those beyond it wait (parked)
    rather than take turns with the others, and read again once the readers may use every core."""
    threads = len(CORES) + 1  # one core is kept off: 2 readers more than the cores left
    ds, arrays, _ = dataset_factory(997, {"x": ("uint8", (3, 9, 11)), "y": ("int64", ())})
    ld = fp.loader(ds, 13, shuffle=True, num_threads=threads, prefetch=3)
    feed = Feed(fp, ld, arrays)
    s = feed.until(lambda: None, lambda s: s["batches"] >= 5, 10)
    assert s["parked_readers"] == 0 and s["spare_cpu"] is None, s
    ld._reader._force_spare_core(1)
    # Each checked batch after the readers are told: some were dispatched before, the rest read by the
    # readers that read on (the parked ones wait on their own condition, a busy one parks after its chunk).
    s = feed.until(lambda: time.sleep(0.001), lambda s: s["parked_readers"] == 2, 300)
    for _ in range(2 * len(ld)):
        s = feed.take(lambda: None)
    assert s["parked_readers"] == 2 and s["spare_cpu"] is not None, s
    ld._reader._force_spare_core(0)
    s = feed.until(lambda: None, lambda s: s["parked_readers"] == 0, 300)
    assert s["spare_cpu"] is None, s
    ld.close()


def test_readers_may_use_the_core_of_a_training_thread_that_waits(dataset_factory, fp):
    ds, arrays, _ = dataset_factory(1001, {"x": ("uint8", (3, 9, 11))})
    ld = fp.loader(ds, 13, shuffle=True, num_threads=1, prefetch=2)
    feed = Feed(fp, ld, arrays)
    feed.until(lambda: time.sleep(0.003), lambda s: s["spare_cpu"] is not None, 200)
    fp.hooks(ld, hold_reads=True)  # the reader stops before its next chunk
    waits = ld.stats()["waits"]
    # At most prefetch batches are read ahead: the third take waits for the held reader.
    taker = threading.Thread(target=lambda: [feed.take(lambda: None) for _ in range(3)], daemon=True)
    taker.start()
    assert fp.wait_until(lambda: ld.stats()["waits"] > waits), "next() never waited: the test proves nothing"
    s = ld.stats()
    assert s["spare_cpu"] is None, s  # set with the wait, under the loader's lock
    fp.release(ld)
    taker.join(fp.HANG)
    assert not taker.is_alive()
    s = feed.until(lambda: time.sleep(0.003), lambda s: s["spare_cpu"] is not None, 5)  # placed again
    assert s["spared_batches"] > 0, s
    ld.close()


def test_one_usable_core_keeps_every_reader_where_it_was(dataset_factory, fp, home_affinity):
    ds, arrays, _ = dataset_factory(300, {"x": ("uint8", (100,))})
    core = min(CORES)
    os.sched_setaffinity(0, {core})  # before the loader: its readers inherit the one core
    others = set(reader_threads())
    ld = fp.loader(ds, 10, shuffle=True, num_threads=2)
    ld._reader._force_spare_core(1)
    feed = Feed(fp, ld, arrays)
    for _ in range(12):
        s = feed.take(lambda: time.sleep(0.0005))
    mine = {t: c for t, c in reader_threads().items() if t not in others}
    assert len(mine) == 2 and all(c == {core} for c in mine.values()), mine
    assert s["spare_cpu"] is None and s["spared_batches"] == 0 and s["reader_cores"] is None, s
    ld.close()
