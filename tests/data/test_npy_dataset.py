"""NpyDataset: structure, len, ds[i], metadata, and every valid .npy variant numpy itself can write."""

import os
import pathlib

import numpy as np
import pytest
import torch

import fastpipe

pytestmark = pytest.mark.timeout(60)

DTYPES = ["bool", "uint8", "int8", "int16", "uint16", "int32", "int64", "float16", "float32", "float64"]


def _assert_tensor_equals(t, ref):
    assert isinstance(t, torch.Tensor)
    assert tuple(t.shape) == ref.shape, f"{tuple(t.shape)} != {ref.shape}"
    assert t.numpy().tobytes() == np.ascontiguousarray(ref).tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rec", [(), (3,), (3, 5, 7)], ids=["scalar", "3", "3x5x7"])
def test_getitem_every_dtype_and_shape(tmp_path, rng, fp, dtype, rec):
    n = 37
    arr = fp.random_array(rng, dtype, (n, *rec))
    path = tmp_path / "x.npy"
    np.save(path, arr)
    ds = fastpipe.NpyDataset(str(path))
    assert len(ds) == n
    for i in [0, 1, n // 2, n - 1, -1, -n, np.int64(5), np.int32(-2)]:
        t = ds[i]
        assert t.dtype == fp.TORCH_DTYPES[dtype]
        _assert_tensor_equals(t, arr[i])


def test_single_path_pathlike_list_dict_structures(tmp_path, rng, fp):
    n = 11
    paths, arrays = fp.write_columns(tmp_path, n, {"a": ("float32", (2, 3)), "b": ("uint8", ())}, rng)

    single = fastpipe.NpyDataset(pathlib.Path(paths["a"]))  # os.PathLike
    item = single[4]
    assert isinstance(item, torch.Tensor)
    _assert_tensor_equals(item, arrays["a"][4])

    as_list = fastpipe.NpyDataset([paths["a"], pathlib.Path(paths["b"])])
    item = as_list[-2]
    assert isinstance(item, tuple) and len(item) == 2
    _assert_tensor_equals(item[0], arrays["a"][n - 2])
    _assert_tensor_equals(item[1], arrays["b"][n - 2])

    as_tuple = fastpipe.NpyDataset((paths["b"], paths["a"]))
    item = as_tuple[0]
    assert isinstance(item, tuple) and len(item) == 2
    _assert_tensor_equals(item[0], arrays["b"][0])
    _assert_tensor_equals(item[1], arrays["a"][0])

    as_dict = fastpipe.NpyDataset({"zeta": paths["b"], "alpha": paths["a"], "idx": paths["idx"]})
    item = as_dict[7]
    assert isinstance(item, dict)
    assert list(item) == ["zeta", "alpha", "idx"], "dict batches must keep the caller's key order"
    _assert_tensor_equals(item["zeta"], arrays["b"][7])
    _assert_tensor_equals(item["alpha"], arrays["a"][7])
    assert item["idx"].item() == 7


def test_metadata_in_column_order(tmp_path, rng, fp):
    paths, arrays = fp.write_columns(
        tmp_path, 9, {"a": ("float16", (4, 2)), "b": ("uint16", ()), "c": ("bool", (5,))}, rng, index=False
    )
    ds = fastpipe.NpyDataset([paths["c"], paths["a"], paths["b"]])
    assert [os.path.realpath(p) for p in ds.paths] == [os.path.realpath(paths[k]) for k in "cab"]
    assert all(isinstance(p, str) for p in ds.paths)
    assert [tuple(s) for s in ds.record_shapes] == [(5,), (4, 2), ()]
    assert list(ds.dtypes) == [torch.bool, torch.float16, torch.uint16]


def test_getitem_out_of_range(tmp_path, rng, fp):
    paths, _ = fp.write_columns(tmp_path, 5, {}, rng)
    ds = fastpipe.NpyDataset(paths["idx"])
    for i in [5, 6, 1000, -6, -1000]:
        with pytest.raises(IndexError):
            ds[i]


def test_getitem_returns_copies(tmp_path, rng, fp):
    paths, arrays = fp.write_columns(tmp_path, 6, {"x": ("int32", (4,))}, rng)
    ds = fastpipe.NpyDataset({"x": paths["x"]})
    a = ds[2]["x"]
    a.fill_(0)
    _assert_tensor_equals(ds[2]["x"], arrays["x"][2])
    np.testing.assert_array_equal(np.load(paths["x"]), arrays["x"])  # the file is untouched


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_format_versions(tmp_path, rng, fp, version):
    arr = fp.random_array(rng, "int16", (23, 3))
    path = tmp_path / "v.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array(f, arr, version=version)
    ds = fastpipe.NpyDataset(str(path))
    assert len(ds) == 23
    for i in range(23):
        _assert_tensor_equals(ds[i], arr[i])


@pytest.mark.parametrize(
    "header",
    [
        "{'descr': '<i4', 'fortran_order': False, 'shape': (7, 2), }",  # what numpy writes
        "{'descr': '<i4', 'fortran_order': False, 'shape': (7, 2)}",  # no trailing comma
        "{'shape': (7, 2), 'fortran_order': False, 'descr': '<i4'}",  # other key order
        "{ 'descr' : '<i4' ,'fortran_order':False,'shape':(7,2) }",  # odd whitespace
        '{"descr": "<i4", "fortran_order": False, "shape": (7, 2)}',  # double quotes
    ],
    ids=["numpy", "no-trailing-comma", "key-order", "whitespace", "double-quotes"],
)
def test_hand_written_valid_headers(tmp_path, rng, fp, header):
    arr = fp.random_array(rng, "int32", (7, 2))
    path = tmp_path / "h.npy"
    path.write_bytes(fp.npy_bytes(header, arr.tobytes()))
    np.testing.assert_array_equal(np.load(path), arr)  # numpy agrees the file is valid
    ds = fastpipe.NpyDataset(str(path))
    assert len(ds) == 7
    for i in range(7):
        _assert_tensor_equals(ds[i], arr[i])


@pytest.mark.parametrize("pad_to", [16, 1], ids=["16-aligned", "unaligned"])
def test_data_offset_not_64_aligned(tmp_path, rng, fp, pad_to):
    """Older numpy padded headers to 16 bytes; numpy's reader accepts any header length."""
    arr = fp.random_array(rng, "float64", (13, 3))
    path = tmp_path / "o.npy"
    path.write_bytes(
        fp.npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (13, 3), }", arr.tobytes(), pad_to=pad_to)
    )
    _, offset = fp.header_of(path)
    assert np.load(path).tobytes() == arr.tobytes()
    ds = fastpipe.NpyDataset(str(path))
    print("data offset", offset)
    for i in range(13):
        _assert_tensor_equals(ds[i], arr[i])


@pytest.mark.parametrize(
    "descr,dtype",
    [("|u1", "uint8"), ("<u1", "uint8"), ("|i1", "int8"), ("|b1", "bool"), ("<u2", "uint16"), ("<f2", "float16")],
)
def test_byte_order_free_and_little_endian_descr(tmp_path, rng, fp, descr, dtype):
    arr = fp.random_array(rng, dtype, (10, 3))
    path = tmp_path / "d.npy"
    path.write_bytes(fp.npy_bytes(f"{{'descr': '{descr}', 'fortran_order': False, 'shape': (10, 3), }}", arr.tobytes()))
    ds = fastpipe.NpyDataset(str(path))
    assert list(ds.dtypes) == [fp.TORCH_DTYPES[dtype]]
    for i in range(10):
        _assert_tensor_equals(ds[i], arr[i])


def test_one_dimensional_column_gives_scalar_records(tmp_path, rng, fp):
    arr = fp.random_array(rng, "float32", (17,))
    path = tmp_path / "s.npy"
    np.save(path, arr)
    ds = fastpipe.NpyDataset(str(path))
    assert [tuple(s) for s in ds.record_shapes] == [()]
    t = ds[3]
    assert t.dim() == 0
    assert t.numpy().tobytes() == arr[3].tobytes()


def test_zero_size_records(tmp_path):
    """Records of shape (0,) carry no bytes, and numpy reads them: so does NpyDataset (the Loader's
    batches of them are tested in test_loader.py)."""
    path = tmp_path / "z.npy"
    np.save(path, np.zeros((5, 0), np.float32))
    ds = fastpipe.NpyDataset(str(path))
    assert len(ds) == 5
    assert tuple(ds[0].shape) == (0,) and ds[4].dtype == torch.float32


def test_bad_columns_argument(tmp_path, rng, fp):
    paths, _ = fp.write_columns(tmp_path, 3, {}, rng)
    with pytest.raises(TypeError):
        fastpipe.NpyDataset(42)
    with pytest.raises(TypeError):
        fastpipe.NpyDataset(None)
    with pytest.raises(ValueError, match="at least one column"):
        fastpipe.NpyDataset([])
    with pytest.raises(ValueError, match="at least one column"):
        fastpipe.NpyDataset({})


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.npy"
    with pytest.raises(FileNotFoundError, match="nope.npy"):
        fastpipe.NpyDataset(str(missing))
    with pytest.raises(FileNotFoundError, match="nope.npy"):
        fastpipe.NpyDataset({"a": str(missing)})


def test_memmap_written_file_and_large_header(tmp_path, rng, fp):
    """Files made by np.lib.format.open_memmap (a common way to write big columns) load too."""
    path = tmp_path / "m.npy"
    mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint16, shape=(29, 4, 4))
    ref = fp.random_array(rng, "uint16", (29, 4, 4))
    mm[:] = ref
    mm.flush()
    del mm
    ds = fastpipe.NpyDataset(str(path))
    assert len(ds) == 29
    for i in (0, 28, -5):
        _assert_tensor_equals(ds[i], ref[i])
