"""write_npy: any map-style dataset -> .npy columns, streamed, returning the NpyDataset."""

import os
import tracemalloc
import weakref

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

import fastpipe

pytestmark = pytest.mark.timeout(120)


def loader_items(ds, batch_size=7):
    out = []
    for b in fastpipe.Loader(ds, batch_size, timeout=30.0):
        if isinstance(b, torch.Tensor):
            out.append(b.numpy().copy())
        elif isinstance(b, dict):
            out.append({k: v.numpy().copy() for k, v in b.items()})
        else:
            out.append(tuple(v.numpy().copy() for v in b))
        del b
    return out


def test_from_tensor_dataset(tmp_path, rng, fp):
    n = 53
    x = torch.from_numpy(fp.random_array(rng, "float32", (n, 3, 4)))
    y = torch.from_numpy(rng.integers(-(2**40), 2**40, size=n))
    z = torch.from_numpy(fp.random_array(rng, "uint16", (n, 2)))
    out = tmp_path / "out"
    out.mkdir()
    ds = fastpipe.write_npy(TensorDataset(x, y, z), str(out), progress=False)
    assert isinstance(ds, fastpipe.NpyDataset)
    assert sorted(os.listdir(out)) == ["0.npy", "1.npy", "2.npy"]
    for k, ref in enumerate((x, y, z)):
        arr = np.load(out / f"{k}.npy")
        assert arr.dtype == ref.numpy().dtype and arr.shape == tuple(ref.shape)
        assert arr.tobytes() == ref.numpy().tobytes()
    assert len(ds) == n
    item = ds[5]
    assert isinstance(item, tuple) and len(item) == 3
    assert item[0].numpy().tobytes() == x[5].numpy().tobytes()
    assert item[1].item() == y[5].item()
    batches = loader_items(ds)
    got = np.concatenate([b[0] for b in batches])
    assert got.tobytes() == x.numpy().tobytes()
    assert np.concatenate([b[1] for b in batches]).tolist() == y.tolist()


class DictDataset(Dataset):
    """Items are dicts of numpy arrays and Python numbers."""

    def __init__(self, img, label, weight, flag):
        self.img, self.label, self.weight, self.flag = img, label, weight, flag

    def __len__(self):
        return len(self.img)

    def __getitem__(self, i):
        return {
            "img": self.img[i].copy(),
            "label": int(self.label[i]),
            "weight": float(self.weight[i]),
            "flag": self.flag[i].copy(),
        }


def test_from_dict_of_numpy_and_python_numbers(tmp_path, rng, fp):
    n = 41
    img = fp.random_array(rng, "uint8", (n, 3, 5, 5))
    label = rng.integers(-(2**31), 2**31, size=n)
    weight = rng.standard_normal(n)
    flag = fp.random_array(rng, "bool", (n, 2))
    out = tmp_path / "dict_out"
    out.mkdir()
    ds = fastpipe.write_npy(DictDataset(img, label, weight, flag), str(out), progress=False)
    assert sorted(os.listdir(out)) == ["flag.npy", "img.npy", "label.npy", "weight.npy"]
    assert np.load(out / "img.npy").tobytes() == img.tobytes()
    assert np.load(out / "flag.npy").tobytes() == flag.tobytes()
    lab = np.load(out / "label.npy")
    wt = np.load(out / "weight.npy")
    # Python numbers become what numpy makes of them (int -> int64, float -> float64)
    assert lab.dtype == np.asarray(int(label[0])).dtype, lab.dtype
    assert wt.dtype == np.asarray(float(weight[0])).dtype, wt.dtype
    assert lab.shape == (n,) and wt.shape == (n,)
    assert lab.tolist() == label.tolist()
    assert wt.tobytes() == weight.astype(wt.dtype).tobytes()
    item = ds[-1]
    assert isinstance(item, dict) and set(item) == {"img", "label", "weight", "flag"}
    assert item["img"].numpy().tobytes() == img[-1].tobytes()
    assert item["label"].item() == int(label[-1])
    batches = loader_items(ds, 8)
    assert all(isinstance(b, dict) for b in batches)
    assert np.concatenate([b["img"] for b in batches]).tobytes() == img.tobytes()
    assert np.concatenate([b["label"] for b in batches]).tolist() == label.tolist()


class SingleDataset(Dataset):
    def __init__(self, data):
        self.data = data

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return torch.from_numpy(self.data[i].copy())


def test_single_item_gives_data_npy_and_single_tensor_batches(tmp_path, rng, fp):
    data = fp.random_array(rng, "int16", (29, 7))
    out = tmp_path / "single"
    out.mkdir()
    ds = fastpipe.write_npy(SingleDataset(data), str(out), progress=False)
    assert os.listdir(out) == ["data.npy"]
    assert np.load(out / "data.npy").tobytes() == data.tobytes()
    assert isinstance(ds[0], torch.Tensor)
    batches = loader_items(ds, 4)
    assert all(isinstance(b, np.ndarray) for b in batches)
    assert np.concatenate(batches).tobytes() == data.tobytes()


class CountingDataset(Dataset):
    """Counts __getitem__ calls and how many returned items are alive when the next one is asked for."""

    def __init__(self, n, record_shape, seed):
        self.n = n
        self.shape = record_shape
        self.seed = seed
        self.calls = []
        self.live = 0
        self.max_live = 0

    def __len__(self):
        return self.n

    def expected(self, i):
        return np.random.default_rng([self.seed, i]).integers(0, 256, size=self.shape, dtype=np.uint8)

    def _gone(self):
        self.live -= 1

    def __getitem__(self, i):
        if isinstance(i, (int, np.integer)) and -self.n <= i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        self.calls.append(int(i))
        self.max_live = max(self.max_live, self.live)
        arr = self.expected(i)
        self.live += 1
        weakref.finalize(arr, self._gone)
        return arr


def test_streams_in_bounded_memory(tmp_path, rng):
    n, shape, chunk = 1_517, (16, 64), 50  # 1.5 MB in all, items of 1 KiB; chunk does not divide n
    seed = int(rng.integers(1 << 31))
    src = CountingDataset(n, shape, seed)
    out = tmp_path / "stream"
    out.mkdir()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        ds = fastpipe.write_npy(src, str(out), progress=False, chunk_size=chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    total = n * int(np.prod(shape))
    print(f"calls={len(src.calls)} max_live={src.max_live} peak={peak} total={total}")
    # every item is fetched; the first may be fetched twice (to learn the structure), nothing else
    assert set(src.calls) == set(range(n)) and len(src.calls) <= n + 1, f"{len(src.calls)} calls for {n} items"
    assert src.max_live <= 2 * chunk + 2, f"{src.max_live} items alive at once with chunk_size={chunk}"
    assert peak < total // 3, f"peak traced memory {peak} B for {total} B of data: not streamed"
    arr = np.load(out / "data.npy")
    assert arr.shape == (n, *shape)
    for i in (0, 1, chunk - 1, chunk, n - 1):
        assert arr[i].tobytes() == src.expected(i).tobytes()
    assert len(ds) == n


def test_progress_bar_on_does_not_break(tmp_path, rng, fp):
    data = fp.random_array(rng, "float32", (10, 2))
    out = tmp_path / "p"
    out.mkdir()
    ds = fastpipe.write_npy(SingleDataset(data), str(out), progress=True)
    assert len(ds) == 10
    assert np.load(out / "data.npy").tobytes() == data.tobytes()


class ListDataset(Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def test_mismatched_item_shape_names_index_and_field(tmp_path):
    items = [{"img": np.zeros((3, 4), np.float32), "y": 1} for _ in range(60)]
    items[37] = {"img": np.zeros((3, 5), np.float32), "y": 1}
    out = tmp_path / "bad"
    out.mkdir()
    with pytest.raises(ValueError) as ei:
        fastpipe.write_npy(ListDataset(items), str(out), progress=False, chunk_size=8)
    msg = str(ei.value)
    assert "37" in msg and "img" in msg, msg


def test_mismatched_item_dtype(tmp_path):
    items = [np.zeros(4, np.int32) for _ in range(20)]
    items[11] = np.zeros(4, np.float64)
    out = tmp_path / "bad_dtype"
    out.mkdir()
    with pytest.raises(ValueError, match="11"):
        fastpipe.write_npy(ListDataset(items), str(out), progress=False)


@pytest.mark.parametrize(
    "item",
    [np.zeros(3, np.complex64), torch.zeros(3, dtype=torch.bfloat16), np.array(["ab", "cd"]), "text"],
    ids=["complex64", "bfloat16", "str-array", "str"],
)
def test_unsupported_dtype(tmp_path, item):
    out = tmp_path / "unsupported"
    out.mkdir()
    with pytest.raises(TypeError):
        fastpipe.write_npy(ListDataset([item] * 4), str(out), progress=False)


class VisionLike(Dataset):
    """torchvision-style items: (uint8 CHW tensor, int label, numpy float32 scalar)."""

    def __init__(self, imgs, labels, scores):
        self.imgs, self.labels, self.scores = imgs, labels, scores

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, i):
        return torch.from_numpy(self.imgs[i].copy()), int(self.labels[i]), np.float32(self.scores[i])


def test_from_vision_style_tuples(tmp_path, rng, fp):
    n = 33
    imgs = fp.random_array(rng, "uint8", (n, 3, 8, 8))
    labels = rng.integers(0, 1000, size=n)
    scores = rng.standard_normal(n).astype(np.float32)
    out = tmp_path / "vision"
    out.mkdir()
    ds = fastpipe.write_npy(VisionLike(imgs, labels, scores), str(out), progress=False, chunk_size=5)
    assert sorted(os.listdir(out)) == ["0.npy", "1.npy", "2.npy"]
    assert np.load(out / "0.npy").tobytes() == imgs.tobytes()
    assert np.load(out / "1.npy").tolist() == labels.tolist()
    sc = np.load(out / "2.npy")
    assert sc.dtype == np.float32 and sc.shape == (n,), "a numpy float32 scalar keeps its dtype"
    assert sc.tobytes() == scores.tobytes()
    assert list(ds.dtypes) == [torch.uint8, torch.from_numpy(np.asarray(1)).dtype, torch.float32]
    batches = loader_items(ds, 4)
    assert np.concatenate([b[0] for b in batches]).tobytes() == imgs.tobytes()


# ---- every item must have item 0's fields; failures leave out_dir as it was ------------------------------
def snapshot(directory):
    """{file name: bytes} of a directory, or None when it does not exist (to prove nothing changed)."""
    if not os.path.isdir(directory):
        return None
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


class FailingDataset(Dataset):
    """Items from ``make(i)``; ``make`` may raise. Records which files out_dir held at each call."""

    def __init__(self, n, make, out_dir=None):
        self.n, self.make, self.out_dir, self.seen = n, make, out_dir, set()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.out_dir is not None and os.path.isdir(self.out_dir):
            self.seen.update(os.listdir(self.out_dir))
        return self.make(i)


def _dict_item(rng, fp, i):
    return {"img": fp.random_array(rng, "float32", (3, 5)), "y": int(rng.integers(100))}


# (name, item 0 and most items, the odd item): every change of fields must name the odd item's index
FIELD_CHANGES = {
    "dict-missing-key": (lambda a, b: {"img": a, "y": b}, lambda a, b: {"img": a}, "'y'"),
    "dict-extra-key": (lambda a, b: {"img": a, "y": b}, lambda a, b: {"img": a, "y": b, "z": b}, "'z'"),
    "dict-renamed-key": (lambda a, b: {"img": a, "y": b}, lambda a, b: {"img": a, "label": b}, "'label'"),
    "tuple-longer": (lambda a, b: (a, b), lambda a, b: (a, b, b), "3 fields"),
    "tuple-shorter": (lambda a, b: (a, b), lambda a, b: (a,), "1 fields"),
    "single-after-tuples": (lambda a, b: (a, b), lambda a, b: a, "single"),
    "tuple-after-singles": (lambda a, b: a, lambda a, b: (a, b), "tuple"),
    "dict-after-tuples": (lambda a, b: (a, b), lambda a, b: {"0": a, "1": b}, "dict"),
    "list-after-dicts": (lambda a, b: {"img": a, "y": b}, lambda a, b: [a, b], "tuple"),
}


@pytest.mark.parametrize("change", list(FIELD_CHANGES))
def test_fields_changing_between_items_names_the_item(tmp_path, rng, fp, change):
    usual, odd, mentions = FIELD_CHANGES[change]
    n, chunk = int(rng.integers(20, 60)), int(rng.integers(3, 8))
    bad = int(rng.integers(chunk, n))  # in a later chunk than the first: files are already being written
    out = tmp_path / "fields"
    src = FailingDataset(n, lambda i: (odd if i == bad else usual)(fp.random_array(rng, "float32", (3, 5)),
                                                                    int(rng.integers(100))), out)
    with pytest.raises(ValueError) as ei:
        fastpipe.write_npy(src, str(out), progress=False, chunk_size=chunk)
    msg = str(ei.value)
    print(msg)
    assert f"item {bad} " in msg and mentions in msg, msg
    assert any(name.endswith(".partial") for name in src.seen), "the test must fail while files are being written"
    assert snapshot(out) is None, f"a failed write left {snapshot(out)}"


def test_dict_keys_may_come_in_any_order(tmp_path, rng, fp):
    n = 37
    img = fp.random_array(rng, "uint8", (n, 3, 7))
    y = rng.integers(-(2**40), 2**40, size=n)
    w = fp.random_array(rng, "float16", (n, 2))
    orders = [list(rng.permutation(["img", "y", "w"])) for _ in range(n)]
    cols = {"img": img, "y": y, "w": w}
    items = [{k: (cols[k][i] if k != "y" else int(y[i])) for k in orders[i]} for i in range(n)]
    out = tmp_path / "order"
    ds = fastpipe.write_npy(ListDataset(items), str(out), progress=False, chunk_size=4)
    for k, ref in cols.items():
        got = np.load(out / f"{k}.npy")
        assert got.dtype == ref.dtype and got.shape == ref.shape, (k, got.dtype, got.shape)
        assert got.tobytes() == ref.tobytes(), f"column {k} was written in the wrong order"
    assert list(ds[0]) == orders[0], "the dataset's keys follow item 0"


@pytest.mark.parametrize("where", ["raises", "bad-shape", "bad-dtype", "interrupt", "last-item"])
@pytest.mark.parametrize("existing", [False, True], ids=["new-dir", "existing-files"])
def test_failure_leaves_out_dir_as_it_was(tmp_path, rng, fp, where, existing):
    """Complete or not at all: whatever fails, no .partial and no new .npy remain, and files of the same
    names written before keep their bytes (a failed rewrite must not destroy the previous data)."""
    n, chunk = int(rng.integers(30, 90)), int(rng.integers(4, 9))
    bad = n - 1 if where == "last-item" else int(rng.integers(chunk, n - 1))
    out = tmp_path / "out"
    if existing:
        out.mkdir()
        np.save(out / "img.npy", fp.random_array(rng, "float64", (5, 2)))
        np.save(out / "y.npy", rng.integers(0, 9, size=5))
        (out / "notes.txt").write_bytes(rng.bytes(33))
    before = snapshot(out)

    def make(i):
        item = {"img": fp.random_array(rng, "float32", (2, 3)), "y": int(rng.integers(9))}
        if i == bad:
            if where == "raises":
                raise RuntimeError("corrupt record")
            if where == "interrupt":
                raise KeyboardInterrupt
            if where == "bad-dtype":
                item["img"] = item["img"].astype(np.float64)
            else:
                item["img"] = item["img"][:, :2]
        return item

    src = FailingDataset(n, make, out)
    expected = {"raises": RuntimeError, "interrupt": KeyboardInterrupt}.get(where, ValueError)
    with pytest.raises(expected) as ei:
        fastpipe.write_npy(src, out, progress=False, chunk_size=chunk)
    if where == "raises" and hasattr(ei.value, "__notes__"):
        assert f"write_npy: raised by dataset[{bad}]" in ei.value.__notes__, ei.value.__notes__
    elif expected is ValueError:
        assert f"item {bad}, field 'img'" in str(ei.value), str(ei.value)
    assert {"img.npy.partial", "y.npy.partial"} <= src.seen, f"out_dir held only {src.seen} while writing"
    after = snapshot(out)
    assert after == before, f"out_dir changed: {sorted(before or [])} -> {sorted(after or [])}"


def test_success_replaces_existing_files_and_keeps_others(tmp_path, rng, fp):
    out = tmp_path / "again"
    out.mkdir()
    np.save(out / "0.npy", np.zeros((3, 3)))
    (out / "1.npy.partial").write_bytes(b"left by a killed run: a name write_npy owns")
    (out / "2.npy").write_bytes(b"not ours")
    n = 19
    x = fp.random_array(rng, "int8", (n, 5))
    y = fp.random_array(rng, "float32", (n,))
    ds = fastpipe.write_npy(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), out, progress=False,
                            chunk_size=6)
    assert sorted(os.listdir(out)) == ["0.npy", "1.npy", "2.npy"]
    assert np.load(out / "0.npy").tobytes() == x.tobytes() and np.load(out / "1.npy").tobytes() == y.tobytes()
    assert (out / "2.npy").read_bytes() == b"not ours"
    assert len(ds) == n


def test_empty_dataset_creates_nothing(tmp_path):
    out = tmp_path / "empty"
    with pytest.raises(ValueError, match="empty"):
        fastpipe.write_npy(ListDataset([]), out, progress=False)
    assert not out.exists()
    out.mkdir()
    (out / "keep.npy").write_bytes(b"x")
    with pytest.raises(ValueError, match="empty"):
        fastpipe.write_npy(TensorDataset(torch.zeros(0, 3)), out, progress=False)
    assert snapshot(out) == {"keep.npy": b"x"}


# ---- nested items: a list of numbers is an array; anything else nested is refused, naming the field --------
@pytest.mark.parametrize(
    "make,field",
    [
        (lambda a: {"img": a, "pair": (a, a)}, "'pair'"),
        (lambda a: {"img": a, "boxes": [a, a]}, "'boxes'"),
        (lambda a: {"img": a, "meta": {"w": 1, "h": 2}}, "'meta'"),
        (lambda a: (a, {"label": 1}), "'1'"),
        (lambda a: (a, [torch.from_numpy(a), 1.0]), "'1'"),
        (lambda a: (a, [[1, 2], [3, "x"]]), "'1'"),
        (lambda a: {"img": a, "y": None}, "'y'"),
        (lambda a: {"img": a, "big": 2**70}, "'big'"),
    ],
    ids=["dict-of-tuple", "dict-of-list-of-arrays", "dict-of-dict", "tuple-of-dict", "tuple-of-list-of-tensor",
         "list-with-str", "none", "int-beyond-int64"],
)
def test_nested_items_are_refused_naming_the_field(tmp_path, rng, fp, make, field):
    out = tmp_path / "nested"
    items = [make(fp.random_array(rng, "float32", (2, 3))) for _ in range(5)]
    with pytest.raises(TypeError) as ei:
        fastpipe.write_npy(ListDataset(items), out, progress=False)
    msg = str(ei.value)
    print(msg)
    assert f"item 0, field {field}" in msg, msg
    assert not out.exists()


def test_nested_items_refused_in_a_later_item(tmp_path, rng, fp):
    n = 23
    items = [{"img": fp.random_array(rng, "float32", (2, 3)), "pts": [[1.0, 2.0], [3.0, 4.0]]} for _ in range(n)]
    bad = int(rng.integers(1, n))
    items[bad]["pts"] = [torch.zeros(2), torch.ones(2)]
    out = tmp_path / "nested_late"
    with pytest.raises(TypeError, match=rf"item {bad}, field 'pts'.*list holding a Tensor"):
        fastpipe.write_npy(ListDataset(items), out, progress=False, chunk_size=4)
    assert not out.exists()


def test_lists_of_numbers_are_arrays(tmp_path, rng):
    """A field that is a (nested) list of numbers is one array, as np.asarray makes it; a top-level list
    is a tuple of fields (as a TensorDataset's items are)."""
    n, a, b = 17, 3, 5
    grid = rng.integers(-1000, 1000, size=(n, a, b))
    vec = rng.standard_normal((n, 7))
    flags = rng.integers(0, 2, size=(n, 2)).astype(bool)
    items = [{"grid": grid[i].tolist(), "vec": tuple(vec[i].tolist()), "flags": flags[i].tolist()} for i in range(n)]
    out = tmp_path / "lists"
    ds = fastpipe.write_npy(ListDataset(items), out, progress=False, chunk_size=5)
    for name, ref in (("grid", grid), ("vec", vec), ("flags", flags)):
        want = np.stack([np.asarray(it[name]) for it in items])
        got = np.load(out / f"{name}.npy")
        assert got.dtype == want.dtype and got.shape == want.shape == ref.shape, (name, got.dtype, got.shape)
        assert got.tobytes() == want.tobytes()
    assert ds[3]["grid"].tolist() == grid[3].tolist()
    rows = [[grid[i, 0].tolist(), vec[i].tolist()] for i in range(n)]  # top level: two fields
    out2 = tmp_path / "rows"
    fastpipe.write_npy(ListDataset(rows), out2, progress=False)
    assert sorted(os.listdir(out2)) == ["0.npy", "1.npy"]
    assert np.load(out2 / "0.npy").tobytes() == grid[:, 0].tobytes()
    assert np.load(out2 / "1.npy").tobytes() == vec.tobytes()


def test_ragged_list_field_names_the_item(tmp_path):
    items = [{"pts": [[1, 2], [3, 4]]} for _ in range(9)]
    items[6] = {"pts": [[1, 2], [3]]}
    out = tmp_path / "ragged"
    with pytest.raises(ValueError, match="item 6, field 'pts'"):
        fastpipe.write_npy(ListDataset(items), out, progress=False, chunk_size=4)
    assert not out.exists()


@pytest.mark.parametrize(
    "item,error",
    [({"a/b": 1}, ValueError), ({"..": 1}, ValueError), ({"": 1}, ValueError), ({1: 1}, TypeError), ({}, ValueError),
     ((), ValueError)],
    ids=["slash", "dotdot", "empty-key", "int-key", "empty-dict", "empty-tuple"],
)
def test_keys_that_cannot_name_a_file(tmp_path, item, error):
    out = tmp_path / "keys"
    with pytest.raises(error, match="item 0"):
        fastpipe.write_npy(ListDataset([item] * 3), out, progress=False)
    assert not out.exists() and not (tmp_path / "a").exists()


@pytest.mark.parametrize("n,chunk", [(1, 1024), (7, 1), (13, 13), (29, 4)])
def test_awkward_sizes_and_empty_records(tmp_path, rng, fp, n, chunk):
    x = fp.random_array(rng, "float64", (n, 3, 0))  # records of no bytes
    y = fp.random_array(rng, "uint16", (n, 1, 3))
    out = tmp_path / "awkward"
    ds = fastpipe.write_npy(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), out, progress=False,
                            chunk_size=chunk)
    assert np.load(out / "0.npy").shape == (n, 3, 0)
    assert np.load(out / "1.npy").tobytes() == y.tobytes()
    assert len(ds) == n and ds.record_shapes == [(3, 0), (1, 3)]


@pytest.mark.parametrize("chunk,error", [(0, ValueError), (-3, ValueError), (2.5, TypeError), (True, TypeError)])
def test_bad_chunk_size(tmp_path, chunk, error):
    with pytest.raises(error, match="chunk_size"):
        fastpipe.write_npy(ListDataset([np.zeros(2)] * 3), tmp_path / "c", progress=False, chunk_size=chunk)
    assert not (tmp_path / "c").exists()


def test_a_directory_in_the_way_is_refused_before_writing(tmp_path, rng, fp):
    out = tmp_path / "dir_in_way"
    (out / "1.npy").mkdir(parents=True)
    x = torch.from_numpy(fp.random_array(rng, "float32", (6, 2)))
    with pytest.raises(IsADirectoryError, match="1.npy"):
        fastpipe.write_npy(TensorDataset(x, x), out, progress=False)
    assert sorted(os.listdir(out)) == ["1.npy"] and os.listdir(out / "1.npy") == []


def test_a_dict_or_tuple_of_columns_is_written_as_it_is(tmp_path, rng, fp):
    n = 1237  # more than one chunk
    x = rng.integers(0, 256, (n, 3, 5, 4), dtype=np.uint8)
    y = torch.from_numpy(rng.integers(0, 10, n))
    w = rng.standard_normal((n, 7)).astype(np.float16)
    ds = fastpipe.write_npy({"image": torch.from_numpy(x), "label": y, "w": w}, tmp_path / "d", progress=False,
                            chunk_size=500)
    assert sorted(os.listdir(tmp_path / "d")) == ["image.npy", "label.npy", "w.npy"]
    np.testing.assert_array_equal(np.load(tmp_path / "d" / "image.npy"), x)
    np.testing.assert_array_equal(np.load(tmp_path / "d" / "label.npy"), y.numpy())
    np.testing.assert_array_equal(np.load(tmp_path / "d" / "w.npy"), w)
    batch = next(iter(fastpipe.Loader(ds, batch_size=n)))
    assert set(batch) == {"image", "label", "w"} and torch.equal(batch["label"], y)
    ds = fastpipe.write_npy((x, y), tmp_path / "t", progress=False)
    a, b = next(iter(fastpipe.Loader(ds, batch_size=n)))
    assert torch.equal(a, torch.from_numpy(x)) and torch.equal(b, y)


@pytest.mark.parametrize("columns,error,match", [
    (lambda: {"x": np.zeros((5, 2)), "y": np.zeros(4)}, ValueError, "column 'y' has 4 rows but column 'x' has 5"),
    (lambda: (np.zeros(3), torch.zeros(2)), ValueError, "column '1' has 2 rows but column '0' has 3"),
    (lambda: {"x": np.zeros(3), "y": [1, 2, 3]}, TypeError, "column 'y' is a list"),
    (lambda: {"x": np.float32(2)}, TypeError, "column 'x' is a float32 of 0 dimensions"),
    (lambda: {"a/b": np.zeros(3)}, ValueError, "cannot name a file"),
    (lambda: {"x": torch.zeros(3, dtype=torch.bfloat16)}, TypeError, "bfloat16 has no .npy representation"),
])
def test_columns_that_do_not_fit_are_named(tmp_path, columns, error, match):
    with pytest.raises(error, match=match):
        fastpipe.write_npy(columns(), tmp_path / "d", progress=False)
    assert not os.path.exists(tmp_path / "d")
