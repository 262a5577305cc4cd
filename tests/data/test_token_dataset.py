"""TokenDataset: flat token files (.bin and 1-D .npy) cut into (x, y) windows of block_size + 1 tokens."""

import numpy as np
import pytest
import torch

import fastpipe

pytestmark = pytest.mark.timeout(60)

BIN_DTYPES = ["uint8", "uint16", "int32", "uint32", "int64"]


def random_tokens(rng, dtype, n):
    """Random tokens spanning the dtype's whole range (sign bits, values above 2**31 for uint32...)."""
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=n, endpoint=True, dtype=dtype)


def windows(tokens, block_size):
    n = (len(tokens) - 1) // block_size
    return [tokens[i * block_size : i * block_size + block_size + 1].astype(np.int64) for i in range(n)]


def window_map(wins):
    """x-bytes -> window number; tests assert the random windows are distinct."""
    m = {w[:-1].tobytes(): i for i, w in enumerate(wins)}
    assert len(m) == len(wins), "random windows collided; rerun"
    return m


def check_item(item, win, block_size):
    assert isinstance(item, (tuple, list)) and len(item) == 2
    x, y = item
    for t in (x, y):
        assert isinstance(t, torch.Tensor) and t.dtype == torch.int64 and tuple(t.shape) == (block_size,)
    assert x.numpy().tobytes() == win[:-1].tobytes()
    assert y.numpy().tobytes() == win[1:].tobytes()


def loader_windows(batches, wmap, wins, block_size, batch_size=None):
    """Checks (x, y) batches and returns the window numbers in yield order."""
    order = []
    for bi, b in enumerate(batches):
        assert isinstance(b, (tuple, list)) and len(b) == 2, f"batch {bi}: {type(b)!r}"
        x, y = b
        assert x.dtype == np.int64 and y.dtype == np.int64
        assert x.shape == y.shape and x.ndim == 2 and x.shape[1] == block_size, f"batch {bi}: {x.shape} {y.shape}"
        if batch_size is not None:
            assert x.shape[0] <= batch_size
        np.testing.assert_array_equal(y[:, :-1], x[:, 1:], err_msg=f"batch {bi}: y is not x shifted by one")
        for r in range(x.shape[0]):
            key = x[r].tobytes()
            assert key in wmap, f"batch {bi} row {r}: x matches no window of the file"
            w = wins[wmap[key]]
            assert y[r].tobytes() == w[1:].tobytes(), f"batch {bi} row {r}: y wrong for window {wmap[key]}"
            order.append(wmap[key])
    return order


@pytest.mark.parametrize("n,block_size", [(10_007, 64), (4_097, 64), (4_096, 64), (65, 64), (1_000, 1), (2_051, 1_024)])
def test_bin_uint16_len_and_getitem(tmp_path, rng, n, block_size):
    tokens = random_tokens(rng, np.uint16, n)
    path = tmp_path / "tok.bin"
    tokens.tofile(path)
    ds = fastpipe.TokenDataset(str(path), block_size)
    wins = windows(tokens, block_size)
    assert len(ds) == (n - 1) // block_size == len(wins)
    for i in sorted({0, 1 % len(ds), len(ds) // 2, len(ds) - 1}):
        check_item(ds[i], wins[i], block_size)
    check_item(ds[-1], wins[-1], block_size)
    with pytest.raises(IndexError):
        ds[len(ds)]


@pytest.mark.parametrize("dtype", BIN_DTYPES)
def test_bin_token_dtypes_widen_exactly(tmp_path, rng, dtype):
    n, block_size = 1_203, 17
    tokens = random_tokens(rng, np.dtype(dtype), n)
    info = np.iinfo(dtype)
    tokens[:4] = [info.min, info.max, 0, info.max - 1]  # extremes in window 0
    path = tmp_path / f"tok_{dtype}.bin"
    tokens.tofile(path)
    ds = fastpipe.TokenDataset(str(path), block_size, dtype=dtype)
    wins = windows(tokens, block_size)
    assert len(ds) == len(wins)
    for i in range(len(ds)):
        check_item(ds[i], wins[i], block_size)
    batches = fastpipe_epoch(ds, 8, shuffle=False)
    order = loader_windows(batches, window_map(wins), wins, block_size, 8)
    assert order == list(range(len(ds)))


def fastpipe_epoch(ds, batch_size, **kw):
    kw.setdefault("timeout", 30.0)
    out = []
    for b in fastpipe.Loader(ds, batch_size, **kw):
        out.append(tuple(t.numpy().copy() for t in b))
        del b
    return out


@pytest.mark.parametrize("dtype", ["uint16", "int32", "uint8", "int64"])
def test_npy_tokens_dtype_from_header(tmp_path, rng, dtype):
    n, block_size = 3_001, 32
    tokens = random_tokens(rng, np.dtype(dtype), n)
    path = tmp_path / "tok.npy"
    np.save(path, tokens)
    # the dtype argument is ignored for .npy: the header decides
    ds = fastpipe.TokenDataset(str(path), block_size, dtype="uint16" if dtype != "uint16" else "int64")
    wins = windows(tokens, block_size)
    assert len(ds) == len(wins)
    for i in (0, 7, len(ds) - 1):
        check_item(ds[i], wins[i], block_size)
    batches = fastpipe_epoch(ds, 16, shuffle=True, seed=3)
    order = loader_windows(batches, window_map(wins), wins, block_size, 16)
    assert sorted(order) == list(range(len(ds)))


def test_every_window_once_per_epoch_shuffled(tmp_path, rng):
    n, block_size, batch = 20_011, 48, 10  # 416 windows -> 41 full batches + a partial one of 6
    tokens = random_tokens(rng, np.uint16, n)
    path = tmp_path / "tok.bin"
    tokens.tofile(path)
    ds = fastpipe.TokenDataset(str(path), block_size)
    wins = windows(tokens, block_size)
    wmap = window_map(wins)
    loader = fastpipe.Loader(ds, batch, shuffle=True, seed=11, timeout=30.0)
    assert len(loader) == -(-len(ds) // batch)
    orders = []
    for e in range(3):
        batches = []
        for b in loader:
            batches.append(tuple(t.numpy().copy() for t in b))
            del b
        assert len(batches) == len(loader)
        assert [b[0].shape[0] for b in batches] == [batch] * (len(ds) // batch) + [len(ds) % batch]
        order = loader_windows(batches, wmap, wins, block_size, batch)
        assert sorted(order) == list(range(len(ds))), f"epoch {e}: windows not visited exactly once"
        orders.append(order)
    assert orders[0] != list(range(len(ds))), "shuffle=True gave the identity order"
    assert orders[0] != orders[1] and orders[1] != orders[2], "epochs repeat the same order"


def test_shuffle_false_in_order_and_drop_last(tmp_path, rng):
    n, block_size, batch = 5_000, 33, 7
    tokens = random_tokens(rng, np.uint16, n)
    path = tmp_path / "tok.bin"
    tokens.tofile(path)
    ds = fastpipe.TokenDataset(str(path), block_size)
    wins = windows(tokens, block_size)
    wmap = window_map(wins)
    order = loader_windows(fastpipe_epoch(ds, batch), wmap, wins, block_size, batch)
    assert order == list(range(len(ds)))
    dropped = fastpipe_epoch(ds, batch, shuffle=True, seed=5, drop_last=True)
    assert len(dropped) == len(ds) // batch
    assert all(b[0].shape[0] == batch for b in dropped)
    order = loader_windows(dropped, wmap, wins, block_size, batch)
    assert len(set(order)) == len(order) == (len(ds) // batch) * batch


def test_same_batches_whatever_num_threads(tmp_path, rng):
    n, block_size = 9_999, 64
    tokens = random_tokens(rng, np.uint16, n)
    path = tmp_path / "tok.bin"
    tokens.tofile(path)
    ds = fastpipe.TokenDataset(str(path), block_size)
    wins = windows(tokens, block_size)
    wmap = window_map(wins)
    orders = []
    for threads in (1, 2, 8):
        run = fastpipe_epoch(ds, 9, shuffle=True, seed=21, num_threads=threads)
        order = loader_windows(run, wmap, wins, block_size, 9)  # every window against numpy's
        assert sorted(order) == list(range(len(ds))), f"{threads} threads: windows not visited exactly once"
        orders.append(order)
    assert orders[0] == orders[1] == orders[2], "the order depends on the thread count"


def test_errors(tmp_path, rng):
    tokens = random_tokens(rng, np.uint16, 100)
    path = tmp_path / "short.bin"
    tokens.tofile(path)
    for bad in (0, -1):
        with pytest.raises(ValueError):
            fastpipe.TokenDataset(str(path), bad)
    # 100 tokens: block_size 99 gives one window, 100 needs 101 tokens
    assert len(fastpipe.TokenDataset(str(path), 99)) == 1
    with pytest.raises(ValueError, match="short.bin"):
        fastpipe.TokenDataset(str(path), 100)

    odd = tmp_path / "odd.bin"
    odd.write_bytes(tokens.tobytes() + b"\x01")  # 201 bytes is not a whole number of uint16 tokens
    with pytest.raises(ValueError, match="odd.bin"):
        fastpipe.TokenDataset(str(odd), 8)

    two_d = tmp_path / "two_d.npy"
    np.save(two_d, tokens.reshape(10, 10))
    with pytest.raises(ValueError, match="two_d.npy"):
        fastpipe.TokenDataset(str(two_d), 8)

    with pytest.raises(FileNotFoundError, match="missing.bin"):
        fastpipe.TokenDataset(str(tmp_path / "missing.bin"), 8)

    with pytest.raises((ValueError, TypeError)):
        fastpipe.TokenDataset(str(path), 8, dtype="float32")
