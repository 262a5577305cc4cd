"""Shared fixtures and helpers for the tests of the loader, its transforms and its reader.

The tests never trust the loader's own bookkeeping: every dataset gets an ``idx`` column holding
``np.arange(N)``, so each batch tells which records it holds, and every other column is compared byte
for byte with ``np.load(path)[idx]``.

Helpers are reached through the ``fp`` fixture (a namespace), so test modules need no import of this
file. Random data comes from the ``rng`` fixture, seeded from a printed seed; rerun a failure with
``FASTPIPE_TEST_SEED=<seed>``.
"""

import ast
import atexit
import gc
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import types
import warnings

import numpy as np
import pytest
import torch

# The tests (and the subprocesses they start) time every conv key afresh: no choices from earlier runs.
os.environ["FASTPIPE_CONV_CACHE"] = "off"
# And keep what they cache where not told (image folders' and shards' indexes, remote shards) in a folder of
# this run's, removed after it: not in the user's ~/.cache, and nothing found there from an earlier run.
_CACHE_HOME = tempfile.mkdtemp(prefix="fastpipe-tests-cache-")
atexit.register(shutil.rmtree, _CACHE_HOME, ignore_errors=True)
os.environ["XDG_CACHE_HOME"] = _CACHE_HOME
for _name in ("FASTPIPE_IMAGE_CACHE", "FASTPIPE_CACHE_DIR"):
    os.environ.pop(_name, None)

DTYPES = ["bool", "uint8", "int8", "int16", "uint16", "int32", "int64", "float16", "float32", "float64"]
TORCH_DTYPES = {
    "bool": torch.bool,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int16": torch.int16,
    "uint16": torch.uint16,
    "int32": torch.int32,
    "int64": torch.int64,
    "float16": torch.float16,
    "float32": torch.float32,
    "float64": torch.float64,
}
# Generous so that a broken loader fails with TimeoutError instead of hanging the run, yet far above
# anything a working loader needs for a few hundred KB.
LOADER_TIMEOUT = 30.0
# Seconds after which something that should happen is called a hang. Only ever an upper bound on a
# wait: the tests measure no speed and synchronise with the reader's own counters, never with sleeps.
HANG = 30.0


def _gpu_missing():
    """Why a `gpu` test cannot run here (None when it can): a CUDA device and fastpipe's CUDA kernels."""
    if not torch.cuda.is_available():
        return "needs a CUDA device"
    import fastpipe

    if not fastpipe.build_info()["cuda"]:
        return "needs fastpipe built with its CUDA kernels (FASTPIPE_CUDA=1 and a CUDA toolkit)"
    return None


def _gpu_required():
    return os.environ.get("FASTPIPE_REQUIRE_GPU") == "1"


def pytest_runtest_setup(item):
    """`gpu` tests skip without a GPU or without the CUDA kernels; under FASTPIPE_REQUIRE_GPU=1 (the device
    script) that is an error, so a GPU run cannot pass by skipping."""
    if item.get_closest_marker("gpu") is None:
        return
    why = _gpu_missing()
    if why and _gpu_required():
        pytest.fail(f"FASTPIPE_REQUIRE_GPU=1 but this test {why}", pytrace=False)
    if why:
        pytest.skip(why)


def _skip_reason(report):
    return report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)


# The packages a GPU run's tests may go without (pytest.importorskip's skip stays a skip): the GPU readings
# and the CuPy cross-checks. Any other import skip of a gpu test (torchvision, the augmentation tests'
# reference) fails a run under FASTPIPE_REQUIRE_GPU=1.
OPTIONAL_ON_GPU = {"cupy", "pynvml"}


def _optional_import(reason):
    """Whether a skip's reason is pytest.importorskip's for one of OPTIONAL_ON_GPU's packages."""
    name = re.match(r"could not import '([\w.]+)'", reason.removeprefix("Skipped: "))
    return bool(name) and name.group(1).split(".")[0] in OPTIONAL_ON_GPU


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under FASTPIPE_REQUIRE_GPU=1 every skip of a `gpu` test is a failure, however it was written: a
    skipif mark (on the test, its parameter or its module: those skip before pytest_runtest_setup above
    runs), pytest.skip() inside the test, or pytest.importorskip of a package the GPU run needs (torchvision:
    the augmentation tests compare with it). Only OPTIONAL_ON_GPU's packages may be missing: the machine's
    choice, not a broken GPU setup."""
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and _gpu_required() and item.get_closest_marker("gpu") is not None):
        return
    if hasattr(report, "wasxfail") or _optional_import(_skip_reason(report)):
        return  # an expected failure, or an optional package that is not installed
    reason = _skip_reason(report)
    report.outcome = "failed"
    report.longrepr = f"FASTPIPE_REQUIRE_GPU=1 but this gpu test was skipped: {reason}"


# Modules with gpu tests skipped whole at collection (pytest.skip with allow_module_level) under
# FASTPIPE_REQUIRE_GPU=1: their gpu tests would vanish unseen, so the run fails, after the other tests
# have run (a collection error would stop the whole run). A module without gpu tests may skip.
_SKIPPED_MODULES = []


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and _gpu_required() and isinstance(collector, pytest.Module)):
        return
    reason = _skip_reason(report)
    if "mark.gpu" in collector.path.read_text() and not _optional_import(reason):
        _SKIPPED_MODULES.append(f"FASTPIPE_REQUIRE_GPU=1 but {report.nodeid} was skipped whole: {reason}")


def pytest_terminal_summary(terminalreporter):
    for line in _SKIPPED_MODULES:
        terminalreporter.write_line(line, red=True)


def pytest_sessionfinish(session, exitstatus):
    if _SKIPPED_MODULES and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _no_tf32_in_gpu_tests(request):
    """float32 GPU tests compare with float64 references: TF32 (10-bit mantissa) would hide errors of
    1e-4 inside its tolerance."""
    if request.node.get_closest_marker("gpu") is None or not torch.cuda.is_available():
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture
def ctrl_c():
    """Python's own Ctrl-C handler, which a run started as a background job (SIGINT ignored, as CI may
    start it) does not install: interrupt_main() does nothing without it."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


@pytest.fixture
def rng(request):
    seed = int(os.environ.get("FASTPIPE_TEST_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
    print(f"\n[{request.node.nodeid}] rng seed = {seed}  (reproduce with FASTPIPE_TEST_SEED={seed})")
    return np.random.default_rng(seed)


def random_array(rng, dtype, shape):
    """Random bytes of any dtype (floats include NaN/inf bit patterns: the loader must copy bytes)."""
    dtype = np.dtype(dtype)
    shape = tuple(shape)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return rng.integers(0, 256, size=nbytes, dtype=np.uint8).view(dtype).reshape(shape)


def write_columns(directory, n, spec, rng, index=True):
    """Writes one .npy per column under ``directory``.

    spec: dict name -> (dtype, record_shape). With ``index`` an ``idx`` column (np.arange(n), int64) comes
    first. Returns (paths, arrays): dicts name -> str path and name -> the array written.
    """
    os.makedirs(directory, exist_ok=True)
    paths, arrays = {}, {}
    cols = dict(spec)
    if index:
        cols = {"idx": ("int64", ()), **cols}
    for name, (dtype, rec) in cols.items():
        arr = np.arange(n, dtype=np.int64) if (index and name == "idx") else random_array(rng, dtype, (n, *rec))
        path = os.path.join(str(directory), f"{name}.npy")
        np.save(path, arr)
        paths[name] = path
        arrays[name] = np.load(path)  # what numpy itself reads back is the reference
    return paths, arrays


def to_np(obj):
    """A copy of a batch (tensor / tuple / list / dict of tensors) as numpy arrays; holds no tensor."""
    if isinstance(obj, torch.Tensor):
        return (obj.view(torch.int16) if obj.dtype == torch.bfloat16 else obj).cpu().numpy().copy()  # numpy has no bf16
    if isinstance(obj, dict):
        return {k: to_np(v) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(to_np(v) for v in obj)
    raise TypeError(f"unexpected batch element {type(obj)!r}")


def epoch(loader_or_iter):
    """One pass: a list of numpy copies of every batch (tensors are dropped at once)."""
    out = []
    for b in loader_or_iter:
        out.append(to_np(b))
        del b
    return out


def take(it, k):
    """k batches from an iterator, as numpy copies."""
    out = []
    for _ in range(k):
        b = next(it)
        out.append(to_np(b))
        del b
    return out


def check_batch_tensors(batch, arrays, names=None):
    """Checks a live batch (dict or tuple of tensors) for dtype, shape, device and contiguity."""
    items = batch.items() if isinstance(batch, dict) else zip(names, batch)
    b = None
    for name, t in items:
        assert isinstance(t, torch.Tensor), f"column {name}: {type(t)!r}"
        ref = arrays[name]
        assert t.device.type == "cpu"
        assert t.dtype == TORCH_DTYPES[ref.dtype.name], f"column {name}: {t.dtype} != {ref.dtype}"
        if b is None:
            b = t.shape[0]
        assert tuple(t.shape) == (b, *ref.shape[1:]), f"column {name}: shape {tuple(t.shape)}"
        assert t.is_contiguous()


def verify(batches, arrays, key="idx"):
    """Checks every column of every (numpy) batch against ``arrays[name][idx]``, byte for byte.

    batches: list of dicts name -> array (as ``epoch`` returns for a dict dataset). Returns the
    concatenated indices of the pass.
    """
    seen = []
    for bi, b in enumerate(batches):
        assert set(b) == set(arrays), f"batch {bi}: keys {sorted(b)} != {sorted(arrays)}"
        idx = b[key]
        assert idx.dtype == np.int64 and idx.ndim == 1, f"batch {bi}: idx {idx.dtype} {idx.shape}"
        assert idx.size > 0, f"batch {bi} is empty"
        assert idx.min() >= 0 and idx.max() < len(arrays[key]), f"batch {bi}: idx out of range {idx}"
        for name, ref in arrays.items():
            got = b[name]
            want = ref[idx]
            assert got.dtype == want.dtype and got.shape == want.shape, (
                f"batch {bi} column {name}: {got.dtype}{got.shape} != {want.dtype}{want.shape}"
            )
            if got.tobytes() != want.tobytes():
                bad = [i for i in range(len(idx)) if got[i].tobytes() != want[i].tobytes()]
                pytest.fail(
                    f"batch {bi} column {name}: {len(bad)} of {len(idx)} records differ from the file, "
                    f"first at position {bad[0]} (record {idx[bad[0]]}): got {got[bad[0]].tobytes()[:32]!r} "
                    f"want {want[bad[0]].tobytes()[:32]!r}"
                )
        seen.append(idx)
    return np.concatenate(seen) if seen else np.zeros(0, np.int64)


def same_batches(a, b):
    """True when two lists of numpy batches are identical, byte for byte and structure for structure."""
    if len(a) != len(b):
        return False

    def eq(x, y):
        if isinstance(x, dict):
            return isinstance(y, dict) and list(x) == list(y) and all(eq(x[k], y[k]) for k in x)
        if isinstance(x, (tuple, list)):
            return type(x) is type(y) and len(x) == len(y) and all(eq(u, v) for u, v in zip(x, y))
        return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()

    return all(eq(x, y) for x, y in zip(a, b))


def batch_idx(batches, key="idx"):
    return [b[key].tolist() for b in batches]


def npy_bytes(header, data=b"", version=(1, 0), magic=b"\x93NUMPY", header_len=None, pad_to=64):
    """A .npy file image with a hand-written header dict (a str), for malformed-header tests."""
    h = header.encode("latin1")
    prefix = 10 if version[0] == 1 else 12
    if pad_to:
        total = prefix + len(h) + 1
        h = h + b" " * ((-total) % pad_to)
    h = h + b"\n"
    n = len(h) if header_len is None else header_len
    if version[0] == 1:
        lenfield = struct.pack("<H", n)
    else:
        lenfield = struct.pack("<I", n)
    return magic + bytes(version) + lenfield + h + data


def header_of(path):
    """(header dict, data offset) of a .npy file, parsed the way numpy does."""
    with open(path, "rb") as f:
        raw = f.read(1 << 16)
    major = raw[6]
    if major == 1:
        (hl,) = struct.unpack("<H", raw[8:10])
        start = 10
    else:
        (hl,) = struct.unpack("<I", raw[8:12])
        start = 12
    return ast.literal_eval(raw[start : start + hl].decode("latin1")), start + hl


def count_threads():
    return len(os.listdir("/proc/self/task"))


def count_fds():
    return len(os.listdir("/proc/self/fd"))


def wait_until(cond, timeout=HANG, interval=0.005):
    """Polls cond() until it is true or timeout seconds passed (a hang); returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        v = cond()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(interval)


def finishes(fn, what, timeout=HANG):
    """fn()'s result, run in a thread; fails the test if it has not returned within ``timeout`` seconds
    (a hang: e.g. close() waiting for a read that never ends). fn's exception is re-raised here."""
    result = {}

    def run():
        try:
            result["value"] = fn()
        except BaseException as e:  # noqa: BLE001
            result["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        pytest.fail(f"{what} did not return within {timeout:.0f} s", pytrace=False)
    if "error" in result:
        raise result["error"]
    return result.get("value")


def hooks(ld, poison=False, hold_reads=False):
    """Sets the batch reader's test hooks (csrc/core/batch_reader.h) on a loader and returns it.

    poison: readers fill each slot region with 0xA5 before reading into it (a slot reused too early
    shows as wrong bytes). hold_reads: every read stalls before it starts until ``release(ld)``.
    """
    ld._reader._set_poison(poison)
    ld._reader._hold_reads(hold_reads)
    return ld


def held_reads(ld):
    """How many reader threads wait at the hold_reads gate now."""
    return ld._reader._held_reads()


def release(ld):
    ld._reader._hold_reads(False)


def run_python(code, timeout=60, env=None, args=()):
    """Runs ``code`` in a fresh interpreter (for things that may crash the process: SIGBUS, abort).

    Returns the CompletedProcess; fails the test with the child's output when it hangs.
    """
    full_env = dict(os.environ)
    full_env.setdefault("PYTHONFAULTHANDLER", "1")
    if env:
        full_env.update(env)
    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full_env,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(
            f"child process hung for {timeout}s\nstdout:\n{e.stdout}\nstderr:\n{e.stderr}", pytrace=False
        )


def describe_exit(proc):
    rc = proc.returncode
    how = f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}"
    return f"{how}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"


def loader(ds, batch_size=1, shuffle=False, **kw):
    """fastpipe.Loader with a test timeout (so a broken loader raises instead of hanging)."""
    import fastpipe

    kw.setdefault("timeout", LOADER_TIMEOUT)
    return fastpipe.Loader(ds, batch_size, shuffle, **kw)


def quiet_loader(ds, batch_size=1, shuffle=False, **kw):
    """Like ``loader`` but ignores warnings (e.g. an O_DIRECT fallback) raised while constructing."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return loader(ds, batch_size, shuffle, **kw)


def fs_type(path):
    """The filesystem type of the mount holding ``path`` (from /proc/mounts), e.g. 'ext4', 'tmpfs'."""
    path = os.path.realpath(str(path))
    best, kind = "", None
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 3:
                continue
            mnt = parts[1].replace("\\040", " ")
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, kind = mnt, parts[2]
    return kind


def o_direct_works(directory):
    """Whether the filesystem holding ``directory`` serves an aligned O_DIRECT read: the independent
    check that a loader's direct-I/O fallback (or its absence) is judged against."""
    import mmap

    path = os.path.join(str(directory), f".o_direct_probe_{os.getpid()}")
    with open(path, "wb") as f:
        f.write(os.urandom(8192))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        os.remove(path)
        return False
    try:
        buf = mmap.mmap(-1, 4096)  # page aligned, as O_DIRECT needs
        return os.preadv(fd, [buf], 4096) == 4096
    except OSError:
        return False
    finally:
        os.close(fd)
        os.remove(path)


_HELPERS = types.SimpleNamespace(
    DTYPES=DTYPES,
    TORCH_DTYPES=TORCH_DTYPES,
    LOADER_TIMEOUT=LOADER_TIMEOUT,
    HANG=HANG,
    finishes=finishes,
    hooks=hooks,
    held_reads=held_reads,
    release=release,
    random_array=random_array,
    write_columns=write_columns,
    to_np=to_np,
    epoch=epoch,
    take=take,
    check_batch_tensors=check_batch_tensors,
    verify=verify,
    same_batches=same_batches,
    batch_idx=batch_idx,
    npy_bytes=npy_bytes,
    header_of=header_of,
    count_threads=count_threads,
    count_fds=count_fds,
    wait_until=wait_until,
    run_python=run_python,
    describe_exit=describe_exit,
    loader=loader,
    quiet_loader=quiet_loader,
    fs_type=fs_type,
    o_direct_works=o_direct_works,
)


@pytest.fixture
def fp():
    """Helper namespace (see the functions above)."""
    return _HELPERS


@pytest.fixture
def dataset_factory(tmp_path, rng):
    """make(n, spec, structure="dict") -> (NpyDataset, arrays, paths); spec as in ``write_columns``.

    structure "dict" gives batches {name: tensor} (idx first); "tuple" gives (idx, col1, ...).
    """
    import fastpipe

    counter = [0]

    def make(n, spec, structure="dict", directory=None):
        counter[0] += 1
        d = directory or (tmp_path / f"ds{counter[0]}")
        paths, arrays = write_columns(d, n, spec, rng)
        if structure == "dict":
            ds = fastpipe.NpyDataset(paths)
        elif structure == "tuple":
            ds = fastpipe.NpyDataset([paths[k] for k in paths])
        else:
            raise ValueError(structure)
        return ds, arrays, paths

    return make


def tuple_to_dict(batches, names):
    """Converts tuple batches to dicts name -> array (for ``verify``)."""
    out = []
    for b in batches:
        assert isinstance(b, tuple), f"expected a tuple batch, got {type(b)!r}"
        assert len(b) == len(names)
        out.append(dict(zip(names, b)))
    return out


_HELPERS.tuple_to_dict = tuple_to_dict


@pytest.fixture
def torch_warm():
    """Starts torch's own lazy thread pools before a test takes a thread-count baseline."""
    torch.ones(1 << 16).sum()
    torch.get_num_threads()
    np.ones(10).sum()
    gc.collect()
    return True
