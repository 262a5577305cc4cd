"""The lifecycle matrix, each case in its own interpreter with a time limit: how a training process using
a Loader ends (normally, by an exception in the loop, a reader error, SIGINT in next(), SIGTERM), with
and without a live iterator, and what it leaves: the expected exit status, no hang, and, where the
process goes on, no reader thread and no file descriptor more than before the loader was made (counted
from /proc). Cases the other lifecycle tests cover in process (fork, held batches, exit without close)
are not repeated here."""

import signal

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(180, method="thread")

# Every record of x (whose first column is 6 * its index) once, byte for byte.
_EXACT = """
def exact_of(x, batches):
    got = np.concatenate(batches)
    n = len(x)
    return np.array_equal(np.sort(got[:, 0]) // 6, np.arange(n)) and np.array_equal(got, x[got[:, 0] // 6])
"""

# argv: data directory, case, "live" or "idle" (an iterator in progress, or none)
SCRIPT = _EXACT + r"""
import os, signal, sys, threading, time
import numpy as np
import torch
import fastpipe
from fastpipe._ext import _C

torch.ones(1 << 22).sum()  # torch's OpenMP threads start before the count: next() may gather through them

directory, case, live = sys.argv[1], sys.argv[2], sys.argv[3] == "live"
x = np.arange(4000 * 6, dtype=np.int32).reshape(4000, 6)
np.save(os.path.join(directory, "x.npy"), x)

def threads():
    return len(os.listdir("/proc/self/task"))

def threads_settled(base):
    # A joined thread leaves /proc/self/task a moment after pthread_join returns (the kernel wakes the
    # joiner before it removes the task): under load the count can lag. A leak stays past the deadline.
    deadline = time.monotonic() + 20
    while threads() != base and time.monotonic() < deadline:
        time.sleep(0.01)
    return threads()

def fds():
    return len(os.listdir("/proc/self/fd"))

def exact(batches):
    return exact_of(x, [b.numpy() for b in batches])

base = threads(), fds()
ld = fastpipe.Loader(fastpipe.NpyDataset(os.path.join(directory, "x.npy")), 64, shuffle=True, num_workers=2,
                     timeout=60)
if case in ("sigint", "sigterm"):
    ld._reader._hold_reads(True)  # test hook: the readers stall before their first read, so next() waits
it = iter(ld)
if live:
    next(it)

def ends():
    # What a process that goes on must get back: a whole new epoch, then its threads and fds.
    global it
    assert exact(list(ld)), "the epoch after it is not exact"
    ld.close()
    del it
    print("counts", threads_settled(base[0]) - base[0], fds() - base[1], flush=True)

if case == "normal":
    if live:
        rest = list(it)
    ends()
elif case == "exception":  # raised in the loop body, caught by the program
    try:
        for i, b in enumerate(it):
            if i == 3:
                raise ValueError("in the loop")
    except ValueError:
        pass
    ends()
elif case == "uncaught":  # the loop's exception ends the program
    for i, b in enumerate(it):
        if i == 3:
            raise ValueError("in the loop")
elif case == "reader-error":
    _C._fault_arm("eio", path="x.npy", after=1, limit=1)
    try:
        list(it)
        sys.exit("no error reached the loop")
    except OSError as e:
        print("OSError", e.errno, flush=True)
    _C._fault_disarm()
    ends()
elif case in ("sigint", "sigterm"):
    # The signal arrives while next() waits for the stalled readers.
    sig = signal.SIGINT if case == "sigint" else signal.SIGTERM
    # Python's own Ctrl-C handler even when started from a background job, which ignores SIGINT
    # (Python then installs none and the signal would never arrive).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Timer(0.5, os.kill, (os.getpid(), sig)).start()
    print("waiting", flush=True)
    next(it)
    sys.exit("next() returned")
elif case == "two-iterators":
    first = iter(ld)
    a = next(first)
    second = iter(ld)  # supersedes the first (documented): it raises, the second reads a whole epoch
    try:
        next(first)
        sys.exit("the superseded iterator went on")
    except RuntimeError as e:
        print("superseded:", e, flush=True)
    assert exact(list(second))
    ends()
print("exiting", flush=True)
"""


@pytest.mark.parametrize("live", ["live", "idle"])
@pytest.mark.parametrize("case", ["normal", "exception", "reader-error", "two-iterators"])
def test_the_process_goes_on_with_nothing_left_behind(tmp_path, fp, case, live):
    proc = fp.run_python(SCRIPT, timeout=90, args=(tmp_path, case, live))
    assert proc.returncode == 0, fp.describe_exit(proc)
    assert "exiting" in proc.stdout and "counts 0 0" in proc.stdout, fp.describe_exit(proc)
    if case == "reader-error":
        assert "OSError 5" in proc.stdout, proc.stdout


@pytest.mark.parametrize("live", ["live", "idle"])
def test_an_uncaught_exception_ends_the_process_normally(tmp_path, fp, live):
    proc = fp.run_python(SCRIPT, timeout=90, args=(tmp_path, "uncaught", live))
    assert proc.returncode == 1, fp.describe_exit(proc)
    assert "ValueError: in the loop" in proc.stderr and "Fatal Python error" not in proc.stderr, fp.describe_exit(proc)


@pytest.mark.parametrize("sig", ["sigint", "sigterm"])
def test_a_signal_during_next_ends_the_process_promptly(tmp_path, fp, sig):
    """SIGINT: KeyboardInterrupt out of next(), the interpreter exits as Python does on Ctrl-C (killed
    by SIGINT after its cleanup); SIGTERM: the default action, at once. Neither waits for the stalled
    readers (run_python calls a wait of 90 s a hang)."""
    proc = fp.run_python(SCRIPT, timeout=90, args=(tmp_path, sig, "idle"))
    assert "waiting" in proc.stdout, fp.describe_exit(proc)
    want = signal.SIGINT if sig == "sigint" else signal.SIGTERM
    assert proc.returncode == -want, fp.describe_exit(proc)
    if sig == "sigint":
        assert "KeyboardInterrupt" in proc.stderr, fp.describe_exit(proc)
    assert "Fatal Python error" not in proc.stderr and "Segmentation" not in proc.stderr, fp.describe_exit(proc)


def test_the_scripts_check_rejects_what_it_should():
    """The exact() check of the script rejects a repeated or a changed record (so "counts 0 0" after it
    means a whole epoch was read)."""
    x = np.arange(40 * 6, dtype=np.int32).reshape(40, 6)
    ns = {"np": np}
    exec(_EXACT, ns)
    good = [x[np.random.default_rng(0).permutation(40)]]
    assert ns["exact_of"](x, good)
    bad = [np.concatenate([x[:39], x[:1]])]
    assert not ns["exact_of"](x, bad)
    changed = x.copy()
    changed[5, 3] += 1
    assert not ns["exact_of"](x, [changed])
