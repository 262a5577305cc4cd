"""torch's TensorDataset given to the Loader: the batches DataLoader makes of it, byte for byte."""

import os
import tempfile

import numpy as np
import pytest
import torch

import fastpipe


def tensors(rng, n):
    """Columns of the dtypes and shapes a TensorDataset holds: features, labels, a mask, token ids."""
    return (torch.from_numpy(rng.standard_normal((n, 7)).astype(np.float32)),
            torch.from_numpy(rng.integers(0, 10, n)),
            torch.from_numpy(rng.integers(0, 2, (n, 3)).astype(bool)),
            torch.from_numpy(rng.integers(-300, 300, (n, 2, 5)).astype(np.int16)),
            torch.from_numpy(rng.standard_normal(n)).half())


@pytest.mark.parametrize("shuffle", [False, True])
def test_batches_are_dataloaders(fp, rng, shuffle):
    n, bs = int(rng.integers(100, 300)), int(rng.integers(3, 40))
    ds = torch.utils.data.TensorDataset(*tensors(rng, n))
    loader = fp.loader(ds, bs, shuffle=shuffle, seed=5)
    assert len(loader) == -(-n // bs) and loader.dataset is ds and len(loader.dataset) == n
    order = list(loader.sampler)  # the Loader's own order for its next pass, DataLoader's sampler below
    assert sorted(order) == list(range(n)) and (order != list(range(n))) == shuffle
    ours = [tuple(t.clone() for t in b) for b in loader]
    theirs = list(torch.utils.data.DataLoader(ds, bs, sampler=order))
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert len(a) == len(b) == 5
        for x, y in zip(a, b):
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)


def test_subset_and_non_contiguous_tensors(fp, rng):
    x = torch.from_numpy(rng.integers(0, 1000, (40, 6))).t().contiguous().t()  # column-major: no longer contiguous
    y = torch.arange(40.0, requires_grad=True)  # a tensor that requires grad: read as its values
    assert not x.is_contiguous()
    ds = torch.utils.data.TensorDataset(x, y)
    part = torch.utils.data.Subset(ds, [39, 0, 17, 5])
    (bx, by), = list(fp.loader(part, 4))
    assert torch.equal(bx, x[[39, 0, 17, 5]]) and torch.equal(by, y.detach()[[39, 0, 17, 5]])


def test_the_written_copy_goes_with_the_loader(fp, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    loader = fp.loader(torch.utils.data.TensorDataset(torch.arange(30)), 8)
    assert os.listdir(tmp_path) == [], "the columns' files are unlinked once written"
    path, = loader._source.paths
    assert "fastpipe-" in os.readlink(path) and os.readlink(path).endswith("(deleted)")
    assert torch.equal(torch.cat([b.clone() for b, in loader]), torch.arange(30))
    loader.close()
    del loader
    try:
        assert "fastpipe-" not in os.readlink(path), "the column's file outlived the Loader"
    except FileNotFoundError:
        pass  # closed, its number not reused


@pytest.mark.parametrize("make", ["TensorDataset", "ImageFolder"])
def test_a_killed_process_leaves_nothing_behind(fp, tmp_path, rng, make):
    """SIGKILL while a Loader reads: the files the datasets wrote for their readers die with the process."""
    from jpegs import make_tree

    make_tree(tmp_path / "images", rng, [(20, 30), (31, 24)])
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = fp.run_python(f"""
        import os, signal, torch, fastpipe
        if {make!r} == "TensorDataset":
            ds = torch.utils.data.TensorDataset(torch.randn(1000, 16), torch.arange(1000))
        else:
            ds = fastpipe.ImageFolder({str(tmp_path / "images")!r}, transform=fastpipe.transforms.CenterCrop(16))
        it = iter(fastpipe.Loader(ds, 2, timeout=60))
        next(it)
        def target(fd):
            try:
                return os.readlink(f"/proc/self/fd/{{fd}}")
            except FileNotFoundError:  # listdir's own descriptor, closed since
                return ""
        print([t for t in map(target, os.listdir("/proc/self/fd")) if "fastpipe-" in t], flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """, env={"TMPDIR": str(scratch)})
    assert proc.returncode == -9, fp.describe_exit(proc) + proc.stderr
    assert str(scratch) in proc.stdout, f"the files were not made in TMPDIR: {proc.stdout}"
    assert os.listdir(scratch) == []


def test_what_cannot_be_read_is_refused(fp):
    with pytest.raises(TypeError, match=r"tensors\[1\]: bfloat16 has no .npy representation; convert with .float"):
        fp.loader(torch.utils.data.TensorDataset(torch.zeros(4), torch.zeros(4, dtype=torch.bfloat16)))
    with pytest.raises(TypeError, match=r"tensors\[0\]: dtype complex64 is not supported"):
        fp.loader(torch.utils.data.TensorDataset(torch.zeros(4, dtype=torch.complex64)))
    with pytest.raises(ValueError, match="holds no tensors"):
        fp.loader(torch.utils.data.TensorDataset())


def test_a_full_temporary_folder_says_what_to_do(fp, monkeypatch):
    """np.save into a folder without room: the error names the tensor, the folder and TMPDIR."""
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "save", full)
    with pytest.raises(OSError, match=r"writing TensorDataset's tensors\[0\] \(480 bytes\) .* failed: No space left "
                                      r"on device; set TMPDIR"):
        fp.loader(torch.utils.data.TensorDataset(torch.zeros(4, 30)))
