"""O_DIRECT reads on a disk filesystem (pytest's tmp_path is on ext4 here; /dev/shm is tmpfs, which
accepts misaligned direct reads that ext4 refuses, so it would hide alignment bugs)."""

import os
import pathlib
import shutil
import tempfile
import warnings

import numpy as np
import pytest

import fastpipe
from fastpipe import _C

pytestmark = pytest.mark.timeout(60)

DISK_FS = {"ext4", "ext3", "xfs", "btrfs"}
REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def disk_dir(tmp_path, fp):
    """A directory on a disk filesystem that serves O_DIRECT: tmp_path where it is one, else a
    temporary directory in the repository's build/ or /var/tmp. Skips, naming every place tried and
    its filesystem, only where none is (pytest -rs shows the reason)."""
    tried = []
    for base in (tmp_path, REPO / "build", pathlib.Path("/var/tmp")):
        base.mkdir(parents=True, exist_ok=True)
        kind = fp.fs_type(base)
        if kind in DISK_FS and fp.o_direct_works(base):
            if base == tmp_path:
                yield tmp_path
                return
            d = pathlib.Path(tempfile.mkdtemp(prefix="fastpipe-direct-", dir=base))
            try:
                yield d
            finally:
                shutil.rmtree(d, ignore_errors=True)
            return
        tried.append(f"{base} ({kind})")
    pytest.skip("no disk filesystem with O_DIRECT found for the direct-I/O tests; tried " + ", ".join(tried))


def direct_loader(ds, batch_size, **kw):
    """A direct-I/O loader; returns it with the warnings raised while constructing and reading."""
    kw.setdefault("timeout", 30.0)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ld = fastpipe.Loader(ds, batch_size, io="direct", **kw)
    return ld, [str(x.message) for x in w if issubclass(x.category, UserWarning)]


def write_with_offset(path, arr, pad_to):
    """A valid .npy whose data starts at an offset numpy would not choose (pad_to=1: any length)."""
    import struct

    descr = np.lib.format.dtype_to_descr(arr.dtype)
    h = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {arr.shape!r}, }}".encode()
    h += b" " * ((-(10 + len(h) + 1)) % pad_to) + b"\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h + arr.tobytes())
    return 10 + len(h)


@pytest.mark.parametrize(
    "dtype,rec,n",
    [
        ("uint8", (3,), 1_001),  # 3-byte records, file of ~3 KB: smaller than one 4 KiB block
        ("uint8", (13,), 1_003),
        ("int16", (4_095 // 2 + 1,), 37),  # 4,096 B records at a 128 B offset: every record straddles blocks
        ("uint8", (4_097,), 29),
        ("float32", (5, 251), 41),  # 5,020 B
        ("float64", (3, 5, 7), 333),
        ("uint8", (1,), 2_999),
    ],
    ids=["3B", "13B", "4096B", "4097B", "5020B", "840B", "1B"],
)
def test_direct_byte_exact_awkward_sizes(disk_dir, fp, rng, dtype, rec, n):
    paths, arrays = fp.write_columns(disk_dir / "d", n, {"x": (dtype, rec)}, rng)
    ds = fastpipe.NpyDataset(paths)
    ld, warns = direct_loader(ds, 16, shuffle=True, seed=1, num_threads=2)
    assert warns == [], f"ext4 supports O_DIRECT; no fallback expected: {warns}"
    assert list(ld.io_modes) == ["direct", "direct"], ld.io_modes
    for e in range(2):
        batches = fp.epoch(ld)
        idx = fp.verify(batches, arrays)
        assert sorted(idx.tolist()) == list(range(n)), f"epoch {e}"


@pytest.mark.parametrize("pad_to", [1, 16], ids=["odd-offset", "16B-offset"])
def test_direct_unaligned_data_offset(disk_dir, fp, rng, pad_to):
    n = 777
    x = fp.random_array(rng, "uint8", (n, 13))
    idx = np.arange(n, dtype=np.int64)
    xp, ip = disk_dir / "x.npy", disk_dir / "idx.npy"
    off_x = write_with_offset(xp, x, pad_to)
    off_i = write_with_offset(ip, idx, pad_to)
    print("data offsets", off_x, off_i)
    assert np.load(xp).tobytes() == x.tobytes()
    ds = fastpipe.NpyDataset({"idx": str(ip), "x": str(xp)})
    ld, warns = direct_loader(ds, 10, shuffle=True, seed=4, num_threads=3)
    assert warns == []
    got = fp.epoch(ld)
    seen = fp.verify(got, {"idx": idx, "x": x})
    assert sorted(seen.tolist()) == list(range(n))


def test_direct_matches_pread_batch_for_batch(disk_dir, fp, rng):
    paths, arrays = fp.write_columns(disk_dir / "d", 3_001, {"a": ("uint8", (13,)), "b": ("float16", (7, 3))}, rng)
    ds = fastpipe.NpyDataset(paths)
    ref = fp.epoch(fastpipe.Loader(ds, 50, shuffle=True, seed=9, io="pread", timeout=30.0))
    assert sorted(fp.verify(ref, arrays).tolist()) == list(range(3_001))
    for threads in (1, 4):
        ld, _ = direct_loader(ds, 50, shuffle=True, seed=9, num_threads=threads)
        assert list(ld.io_modes) == ["direct"] * 3, ld.io_modes
        got = fp.epoch(ld)
        fp.verify(got, arrays)  # the bytes against numpy; the order against pread's, batch for batch
        assert fp.same_batches(ref, got), f"direct with {threads} threads differs from pread"


def test_direct_readers_never_step_back_beside_next(disk_dir, fp, rng):
    """Reader threads of a direct column wait on the device, not on a core: while next() reads a chunk
    itself they go on reading however many they are (stats()["stepped_back"] stays 0; stepping back as
    copying readers do kept 16 readers to about 2 reads in flight). Each read is made 1 ms slower, a
    device's latency, so that readers are reading whenever next() reads. The batches stay pread's."""
    paths, arrays = fp.write_columns(disk_dir / "d", 301, {"x": ("uint8", (20_000,))}, rng)
    ds = fastpipe.NpyDataset(paths)
    want = fp.epoch(fastpipe.Loader(ds, 32, shuffle=True, seed=3, io="pread", timeout=30.0))
    fp.verify(want, arrays)
    ld, _ = direct_loader(ds, 32, shuffle=True, seed=3, num_threads=len(os.sched_getaffinity(0)) + 2)
    _C._fault_arm("slow", path=paths["x"])
    try:
        assert fp.same_batches(want, fp.epoch(ld))
        assert _C._fault_count() > 0
    finally:
        _C._fault_disarm()
    st = ld.stats()
    assert st["helped_chunks"] > 0 and st["stepped_back"] == 0, st


def test_direct_unshuffled_last_record_ends_at_eof(disk_dir, fp, rng):
    """In order, so the final read reaches end of file, where an aligned read comes back short."""
    paths, arrays = fp.write_columns(disk_dir / "d", 4_099, {"x": ("uint8", (7,))}, rng)
    ds = fastpipe.NpyDataset(paths)
    ld, _ = direct_loader(ds, 1_000)
    idx = fp.verify(fp.epoch(ld), arrays)
    assert idx.tolist() == list(range(4_099))


def test_direct_token_windows(disk_dir, rng):
    """Token windows overlap by one token and have a stride of block_size tokens: 2,050 B records at a
    2,048 B stride."""
    tokens = rng.integers(0, 65536, size=64 * 1024 + 77, dtype=np.uint16)
    path = disk_dir / "tok.bin"
    tokens.tofile(path)
    bs = 1_024
    ds = fastpipe.TokenDataset(str(path), bs)
    ld, warns = direct_loader(ds, 4, shuffle=True, seed=2, num_threads=2)
    assert warns == []
    windows = {tokens[i * bs : i * bs + bs].astype(np.int64).tobytes(): i for i in range(len(ds))}
    assert len(windows) == len(ds)
    seen = []
    for x, y in ld:
        xn, yn = x.numpy(), y.numpy()
        for r in range(xn.shape[0]):
            i = windows.get(xn[r].tobytes())
            assert i is not None, "a window matches no place in the file"
            assert yn[r].tobytes() == tokens[i * bs + 1 : i * bs + bs + 1].astype(np.int64).tobytes()
            seen.append(i)
        del x, y, xn, yn
    assert sorted(seen) == list(range(len(ds)))


def test_direct_on_tmpfs(fp, rng):
    """tmpfs may refuse O_DIRECT (older kernels) or accept it: the loader falls back, with exactly one
    warning, exactly where the filesystem refuses a direct read, and the bytes are right either way."""
    if not os.path.isdir("/dev/shm") or fp.fs_type("/dev/shm") != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        works = fp.o_direct_works(d)
        paths, arrays = fp.write_columns(d, 501, {"x": ("uint8", (13,))}, rng)
        ds = fastpipe.NpyDataset(paths)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            ld = fastpipe.Loader(ds, 16, shuffle=True, io="direct", timeout=30.0)
            got = fp.epoch(ld) + fp.epoch(ld) + fp.epoch(ld)
        warns = [str(x.message) for x in w if issubclass(x.category, UserWarning)]
        print(f"O_DIRECT on tmpfs: {works}; modes {ld.io_modes}; {warns}")
        fp.verify(got, arrays)
        if works:
            assert list(ld.io_modes) == ["direct", "direct"] and warns == []
        else:
            assert list(ld.io_modes) == ["pread", "pread"]
            assert len(warns) == 2 and all("io='direct' unavailable" in m for m in warns), warns
        ld.close()


def test_direct_readers_never_park(disk_dir, fp, rng):
    """Readers of a direct column kept off the training thread's core all go on reading
    (stats()["parked_readers"] stays 0): they wait on the device, and fewer would keep fewer reads in
    flight. Copying readers beyond the cores left to them park (test_loader_placement.py)."""
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("the readers keep off a core only where 2 are usable")
    paths, arrays = fp.write_columns(disk_dir / "d", 301, {"x": ("uint8", (20_000,))}, rng)
    ld, _ = direct_loader(fastpipe.NpyDataset(paths), 32, shuffle=True, seed=3, num_threads=cores + 1)
    ld._reader._force_spare_core(1)
    for _ in range(2):
        got = []
        for b in ld:
            got.append(fp.to_np(b))
            del b
            assert ld.stats()["parked_readers"] == 0, ld.stats()
        assert sorted(fp.verify(got, arrays).tolist()) == list(range(301))
    assert ld.stats()["spared_batches"] > 0, ld.stats()
