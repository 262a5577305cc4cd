"""torchvision's in-memory datasets (CIFAR10, MNIST) handed to fastpipe.Loader as they are: written once as
.npy columns under the cache, their pipelines fused into CropMirrorNormalize; checked against torchvision's
own DataLoader output, and the random crops against numpy on the windows the transform reports."""

import os

import numpy as np
import pytest
import torch

import fastpipe
from fastpipe.data import torchvision_arrays

tv = pytest.importorskip("torchvision")
T1 = tv.transforms
T2 = pytest.importorskip("torchvision.transforms.v2")
pytestmark = [pytest.mark.timeout(120, method="thread"), pytest.mark.torch_build]
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "fastpipe" / "torchvision_arrays"


def in_memory(cls, data, targets, transform, target_transform=None):
    """An instance of torchvision's ``cls`` holding ``data`` and ``targets``, as its constructor leaves it
    after reading its files (which the tests do not have)."""
    ds = cls.__new__(cls)
    ds.root, ds.train, ds.transform, ds.target_transform = "/nowhere", True, transform, target_transform
    ds.data, ds.targets = data, targets
    return ds


def cifar(rng, n, transform, **kw):
    data = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    return in_memory(tv.datasets.CIFAR10, data, rng.integers(0, 10, n).tolist(), transform, **kw)


def test_cifar_eval_pipelines_match_torchvisions_dataloader(rng):
    for steps in ([T1.ToTensor(), T1.Normalize(CIFAR_MEAN, CIFAR_STD)],
                  [T2.ToImage(), T2.ToDtype(torch.float32, scale=True), T2.Normalize(CIFAR_MEAN, CIFAR_STD)],
                  [T1.CenterCrop(24), T1.ToTensor()]):
        ds = cifar(rng, 203, T1.Compose(steps))
        loader = fastpipe.Loader(ds, batch_size=20)
        assert loader.dataset is ds, "the dataset given, as DataLoader's"
        ours = [(x.clone(), y.clone()) for x, y in loader]
        theirs = list(torch.utils.data.DataLoader(ds, batch_size=20))
        assert len(ours) == len(theirs) == 11
        for (x, y), (rx, ry) in zip(ours, theirs, strict=True):
            assert torch.equal(y, ry) and x.shape == rx.shape and x.dtype == rx.dtype
            torch.testing.assert_close(x, rx, atol=2e-6, rtol=0)


@pytest.mark.parametrize("crop", [
    lambda T: [T.RandomCrop(32, padding=4)],
    lambda T: [T.Pad(4), T.RandomCrop(32)],  # older CIFAR scripts' spelling
    lambda T: [T.Pad(1), T.RandomCrop(32, padding=3)],
], ids=["padding", "pad-then-crop", "both"])
@pytest.mark.parametrize("T", [T1, T2], ids=["v1", "v2"])
def test_cifar_train_pipeline_crops_where_its_windows_say(rng, T, crop):
    """RandomCrop(32, padding=4) + flip (or a Pad before the crop): each image is numpy's crop of the
    zero-padded image at the window the fused transform reports (its draws are fastpipe's, not torch's
    generator's)."""
    to_float = [T.ToTensor()] if T is T1 else [T.ToImage(), T.ToDtype(torch.float32, scale=True)]
    ds = cifar(rng, 150, T.Compose(crop(T) + [T.RandomHorizontalFlip()] + to_float +
                                   [T.Normalize(CIFAR_MEAN, CIFAR_STD)]))
    fused = torchvision_arrays.convert_transform(ds.transform)
    assert (fused.crop, fused.random_crop, fused.padding, fused.mirror) == ((32, 32), True, 4, 0.5)
    loader = fastpipe.Loader(ds, batch_size=16, seed=5)
    padded = np.pad(ds.data, ((0, 0), (4, 4), (4, 4), (0, 0))).astype(np.float64)
    mean, std = np.array(CIFAR_MEAN), np.array(CIFAR_STD)
    for epoch in range(2):  # each epoch its own windows
        seen = 0
        for x, y in loader:
            idx = list(range(seen, seen + len(x)))
            seen += len(x)
            assert y.tolist() == [ds.targets[i] for i in idx]
            for img, i, (y0, x0, flip) in zip(x, idx, fused.windows((32, 32, 3), idx, epoch, seed=5), strict=True):
                crop = padded[i, y0 + 4:y0 + 36, x0 + 4:x0 + 36]
                ref = ((crop[:, ::-1] if flip else crop) / 255 - mean) / std
                np.testing.assert_allclose(img.permute(1, 2, 0).numpy(), ref, atol=2e-6, rtol=0)
        assert seen == 150


def test_mnist_tensors_one_channel(rng):
    data = torch.from_numpy(rng.integers(0, 256, (77, 28, 28), dtype=np.uint8))
    ds = in_memory(tv.datasets.MNIST, data, torch.from_numpy(rng.integers(0, 10, 77)),
                   T1.Compose([T1.ToTensor(), T1.Normalize((0.1307,), (0.3081,))]))
    (x, y), = list(fastpipe.Loader(ds, batch_size=77))
    (rx, ry), = list(torch.utils.data.DataLoader(ds, batch_size=77))
    assert x.shape == rx.shape == (77, 1, 28, 28) and torch.equal(y, ry)
    torch.testing.assert_close(x, rx, atol=2e-6, rtol=0)


def test_written_once_per_content(rng, cache):
    ds = cifar(rng, 40, T1.ToTensor())
    list(fastpipe.Loader(ds, batch_size=8))
    (folder,) = os.listdir(cache)
    stamps = {f: os.stat(cache / folder / f).st_mtime_ns for f in os.listdir(cache / folder)}
    assert sorted(stamps) == ["image.npy", "label.npy"]
    list(fastpipe.Loader(ds, batch_size=8))
    assert {f: os.stat(cache / folder / f).st_mtime_ns for f in os.listdir(cache / folder)} == stamps
    ds.data = ds.data.copy()
    ds.data[0, 0, 0, 0] ^= 1
    list(fastpipe.Loader(ds, batch_size=8))
    assert len(os.listdir(cache)) == 2, "other bytes must be written anew"


def test_a_random_split_of_cifar(rng):
    ds = cifar(rng, 100, T1.Compose([T1.ToTensor()]))
    train, val = torch.utils.data.random_split(ds, [80, 20], generator=torch.Generator().manual_seed(2))
    x, y = next(iter(fastpipe.Loader(val, batch_size=20)))
    assert y.tolist() == [ds.targets[i] for i in val.indices]
    torch.testing.assert_close(x, torch.stack([val[i][0] for i in range(20)]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("steps, match", [
    ([T1.RandomRotation(10), T1.ToTensor()], "RandomRotation"),
    ([T1.RandomCrop(32, padding=4, padding_mode="reflect"), T1.ToTensor()], "padding other than one int of zeros"),
    ([T1.RandomCrop(32, padding=(2, 4)), T1.ToTensor()], "padding other than one int of zeros"),
    ([T1.RandomCrop(32)], "float tensors"),
    ([T1.PILToTensor()], "float tensors"),
    ([T1.Pad(4), T1.CenterCrop(32), T1.ToTensor()], "after a Pad"),
    ([T1.Pad(4, fill=1), T1.RandomCrop(32), T1.ToTensor()], "padding other than one int of zeros"),
    ([T1.Pad(4)], "Pad only as the padding of a RandomCrop"),
    ([T1.RandomCrop(32, pad_if_needed=True), T1.ToTensor()], "pad_if_needed"),
], ids=["rotation", "reflect", "uneven", "pil", "uint8", "pad-centre", "pad-fill", "pad-alone", "if-needed"])
def test_what_cannot_be_fused_is_named(rng, steps, match):
    with pytest.raises(ValueError, match=match):
        fastpipe.Loader(cifar(rng, 10, T1.Compose(steps)))


def test_other_in_memory_datasets_are_not_taken_for_these(rng):
    """SVHN keeps its images CHW: not read as CIFAR's HWC (the Loader refuses it as any other dataset)."""
    svhn = tv.datasets.SVHN.__new__(tv.datasets.SVHN)
    svhn.data, svhn.labels = rng.integers(0, 256, (10, 3, 32, 32), dtype=np.uint8), np.zeros(10, np.int64)
    assert not torchvision_arrays.is_arrays_dataset(svhn)
    with pytest.raises(TypeError, match="got SVHN"):
        fastpipe.Loader(svhn)


@pytest.mark.parametrize("collate", [None, "list"])
def test_a_target_transform_maps_each_label_as_dataloader_does(rng, collate):
    """torchvision's target_transform gets each label as an int; its results are collated as DataLoader's
    (one-hot tensors stacked, here), and a collate_fn sees them per sample."""
    def one_hot(y):
        assert type(y) is int
        return torch.nn.functional.one_hot(torch.tensor(y), 10).float() * (y + 1)

    ds = cifar(rng, 57, T1.ToTensor(), target_transform=one_hot)
    collate_fn = None if collate is None else (lambda items: [torch.stack(c) for c in zip(*items)])
    ours = [(x.clone(), y.clone()) for x, y in fastpipe.Loader(ds, batch_size=16, collate_fn=collate_fn)]
    theirs = list(torch.utils.data.DataLoader(ds, batch_size=16, collate_fn=collate_fn))
    assert len(ours) == len(theirs) == 4
    for (x, y), (rx, ry) in zip(ours, theirs, strict=True):
        assert y.shape == ry.shape == (len(x), 10) and torch.equal(y, ry)
        torch.testing.assert_close(x, rx, atol=2e-6, rtol=0)
