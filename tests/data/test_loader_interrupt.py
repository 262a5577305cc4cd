"""Every wait of a device loader ends, and Ctrl-C works: a device decode that never returns (a stuck
driver call, played by the simulated device) hangs neither the training loop's next(), nor a new pass's
iter(), nor close(). The waits poll for signals while the GIL is released; the stuck thread is left to
end on its own and holds what it touches, so that it ends safely once the call returns."""

import _thread
import os
import sys
import threading
import time

import numpy as np
import pytest

import fastpipe
from fastpipe.data import _device
from fastpipe.transforms import CenterCrop

from jpegs import jpeg_bytes, picture, write

def interrupt_when(fp, condition):
    """As Ctrl-C once condition() holds (within fp.HANG; else never, and the test's wait fails): the main
    thread's next signal check raises KeyboardInterrupt. Returns the list that receives the time sent."""
    sent = []

    def run():
        if fp.wait_until(condition):
            sent.append(time.monotonic())
            _thread.interrupt_main()

    threading.Thread(target=run, daemon=True).start()
    return sent


PACKAGE = os.path.dirname(os.path.abspath(fastpipe.__file__)) + os.sep
THIS_FILE = os.path.abspath(__file__)


def next_in_frame(it):
    """next(it) in a Python frame of its own, which main_thread_in("next_in_frame") finds: a pass's
    __next__ is C code (fastpipe._C.PassIterator), with no frame."""
    return next(it)


def main_thread_in(function):
    """Whether the main thread is (below) a call of fastpipe's or this file's `function` (it then waits in
    C++, or is about to: the signal is seen by the wait's next poll)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None:
        if frame.f_code.co_name == function and (frame.f_code.co_filename.startswith(PACKAGE)
                                                 or frame.f_code.co_filename == THIS_FILE):
            return True
        frame = frame.f_back
    return False


@pytest.fixture
def folder(tmp_path, rng):
    for k in range(8):
        write(str(tmp_path / "t" / f"c{k % 2}" / f"{k}.jpg"), jpeg_bytes(picture(rng, 40 + k, 50)))
    return fastpipe.ImageFolder(str(tmp_path / "t"), cache_dir="off")


@pytest.mark.timeout(120, method="thread")
def test_ctrl_c_during_a_stuck_device_decode_ends_the_loader_within_a_second(folder, ctrl_c, fp):
    t = CenterCrop(24, resize=30, dct_scaling=False)
    before = fp.count_threads()
    with _device.simulated() as sim:
        ld = fastpipe.Loader(folder, batch_size=2, transforms={0: t}, device="cuda", image_decode="device",
                             prefetch=1, timeout=60)
        sim._fail("hang", count=1, after=1)  # the second batch's decode call never returns
        it = iter(ld)
        next(it)
        # The next batch's wait for its stuck decode (the decode may hang before next() is called: the
        # batch is issued ahead).
        sent = interrupt_when(fp, lambda: sim._hanging() == 1 and main_thread_in("next_in_frame"))
        with pytest.raises(KeyboardInterrupt):
            next_in_frame(it)
        assert time.monotonic() - sent[0] < 1.0
        # A new pass waits for the abandoned pass's queued work: the same stuck call.
        sent = interrupt_when(fp, lambda: main_thread_in("_start"))
        ld.set_epoch(1)
        with pytest.raises(KeyboardInterrupt):
            iter(ld)
        assert time.monotonic() - sent[0] < 1.0
        start = time.monotonic()
        ld.close()
        assert time.monotonic() - start < 1.0
        assert sim._hanging() == 1  # still stuck: the loader did not wait for it
        del it, ld
        sim._release_hangs()
    # Once the call returns, the thread left behind ends and lets go of the (simulated) device, whose
    # streams' threads end with it.
    del sim
    assert fp.wait_until(lambda: fp.count_threads() <= before), f"threads left: {fp.count_threads()} > {before}"


@pytest.mark.timeout(120, method="thread")
def test_ctrl_c_while_next_reads_chunks_itself_ends_it_within_a_second(tmp_path, rng, ctrl_c, fp):
    """A next() that reads chunks while it waits for the reader (stats()["helped_chunks"]) checks for
    Ctrl-C between them. The reader's chunk, batch 0's first, is 4 progressive 25-megapixel JPEGs (~1.5 s
    on 2 cores); next() meanwhile reads the later chunks, of 4 large JPEGs each (~0.1 s), dozens of them
    before the read-ahead is full: checking only when it had nothing left to read, it saw the signal when
    its batch was ready, 1.8 s late on 2 cores."""
    tile = picture(rng, 1000, 1000)
    huge = jpeg_bytes(np.tile(tile, (5, 5, 1)), progressive=True)
    large = jpeg_bytes(picture(rng, 1600, 1600))
    for k in range(96):
        write(str(tmp_path / "t" / "c" / f"{k:03d}.jpg"), huge if k < 4 else large)
    ld = fastpipe.Loader(fastpipe.ImageFolder(str(tmp_path / "t"), cache_dir="off"), batch_size=8,
                         transforms={0: CenterCrop(24, resize=30, dct_scaling=False)}, num_threads=1, prefetch=12,
                         timeout=60)
    fp.hooks(ld, hold_reads=True)
    it = iter(ld)
    assert fp.wait_until(lambda: fp.held_reads(ld) == 1)  # the reader has taken batch 0's first chunk
    fp.hooks(ld, hold_reads=False)
    sent = interrupt_when(fp, lambda: ld.stats()["helped_chunks"] > 0 and main_thread_in("next_in_frame"))
    with pytest.raises(KeyboardInterrupt):
        next_in_frame(it)
    assert time.monotonic() - sent[0] < 1.0, ld.stats()
    ld.close()
