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
