"""fastpipe.transforms.CropMirrorNormalize in the Loader, against a float64 reference built here: the
crops and flips from an independent Python implementation of the documented counter-based hash."""

import sys

import numpy as np
import pytest
import torch

import fastpipe
from fastpipe.transforms import CropMirrorNormalize

M64 = (1 << 64) - 1
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def bits(seed, epoch, index, what):
    return mix64(mix64(mix64(mix64(seed & M64) ^ epoch) ^ index) ^ what)


def window(t, h, w, oh, ow, seed, epoch, index):
    """(y0, x0, flip): where the crop starts in the image (negative in the padding), drawn as torchvision's
    RandomCrop draws in the padded image."""
    hh, ww = h + 2 * t.padding, w + 2 * t.padding
    if t.random_crop:
        y0, x0 = bits(seed, epoch, index, 0) % (hh - oh + 1), bits(seed, epoch, index, 1) % (ww - ow + 1)
    else:
        y0, x0 = (hh - oh) // 2, (ww - ow) // 2
    return y0 - t.padding, x0 - t.padding, (bits(seed, epoch, index, 2) >> 40) < t.mirror * (1 << 24)


def reference(t, images, index, seed, epoch):
    """float64 (N, C, oh, ow) or (N, oh, ow, C): crop, flip, (x / 255 - mean) / std."""
    hwc = images if t.in_layout == "HWC" else images.transpose(0, 2, 3, 1)
    n, h, w, c = hwc.shape
    oh, ow = t.crop or (h, w)
    mean = np.broadcast_to(np.array(t.mean, np.float64), (c,))
    std = np.broadcast_to(np.array(t.std, np.float64), (c,))
    out = np.empty((n, oh, ow, c))
    p = t.padding
    padded = np.pad(hwc, ((0, 0), (p, p), (p, p), (0, 0)))  # zeros, as torchvision's RandomCrop(padding=p)
    for k, i in enumerate(index):
        y0, x0, flip = window(t, h, w, oh, ow, seed, epoch, int(i))
        crop = padded[k, y0 + p:y0 + p + oh, x0 + p:x0 + p + ow].astype(np.float64)
        out[k] = ((crop[:, ::-1] if flip else crop) / 255 - mean) / std
    return out if t.layout == "NHWC" else out.transpose(0, 3, 1, 2)


def check(got, ref, dtype):
    """Within one rounding of the output dtype (float32 math, then one rounding to the dtype)."""
    ulp = {torch.float32: 2**-22, torch.float16: 2**-10, torch.bfloat16: 2**-7}[dtype]
    err = np.abs(got.double().numpy() - ref)
    tol = ulp * np.maximum(np.abs(ref), 2**-14) + 1e-6
    assert (err <= tol).all(), f"max error {err.max():.3g} (allowed {tol[err.argmax() // 1]:.3g})"


@pytest.fixture
def images(tmp_path, rng):
    def make(n, shape, name="img"):
        x = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
        y = np.arange(n, dtype=np.int64)
        np.save(tmp_path / f"{name}.npy", x)
        np.save(tmp_path / "idx.npy", y)
        return x, fastpipe.NpyDataset({"idx": str(tmp_path / "idx.npy"), "image": str(tmp_path / f"{name}.npy")})

    return make


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(crop=(13, 9)),
        dict(crop=(13, 9), random_crop=True, mirror=0.5),
        dict(crop=(17, 19), mirror=1.0, layout="NHWC"),
        dict(crop=(5, 6), random_crop=True, mirror=0.3, out_dtype=torch.float16),
        dict(random_crop=True, mirror=0.5, out_dtype=torch.bfloat16, layout="NHWC"),
        dict(random_crop=True, padding=4, mirror=0.5),  # CIFAR's RandomCrop(32, padding=4) + flip
        dict(crop=(13, 9), random_crop=True, padding=2, layout="NHWC"),
        dict(crop=(21, 24), padding=3, mirror=1.0),  # the centred crop reaches into the padding
    ],
    ids=["plain", "centre-crop", "random-crop-mirror", "nhwc-always-flipped", "fp16", "bf16-nhwc", "cifar-padding",
         "padding-smaller-crop", "padding-centre"],
)
@pytest.mark.parametrize("in_layout", ["HWC", "CHW"])
def test_batches_match_the_float64_reference(images, fp, kwargs, in_layout):
    shape = (17, 19, 3) if in_layout == "HWC" else (3, 17, 19)
    x, ds = images(61, shape)
    t = CropMirrorNormalize(MEAN, STD, in_layout=in_layout, **kwargs)
    ld = fp.loader(ds, 8, shuffle=True, seed=7, transforms={"image": t}, num_threads=3)
    dtype = t.out_dtype
    for epoch in range(2):
        for b in ld:
            idx = b["idx"].numpy()
            img = b["image"]
            oh, ow = t.crop or (17, 19)
            assert img.dtype == dtype
            assert tuple(img.shape) == ((len(idx), 3, oh, ow) if t.layout == "NCHW" else (len(idx), oh, ow, 3))
            check(img, reference(t, x[idx], idx, 7, epoch), dtype)


def test_random_choices_depend_on_seed_epoch_and_sample_only(images, fp):
    x, ds = images(40, (12, 12, 1))
    t = CropMirrorNormalize(0.5, 0.5, crop=(6, 6), random_crop=True, mirror=0.5)

    def run(**kw):
        ld = fp.loader(ds, 5, shuffle=True, transforms={"image": t}, **kw)
        out = {}
        for b in ld:
            for i, im in zip(b["idx"].tolist(), b["image"], strict=True):
                out[i] = im.clone()
        return out

    a, b = run(seed=3, num_threads=1), run(seed=3, num_threads=4, prefetch=1)
    assert all(torch.equal(a[i], b[i]) for i in range(40)), "threads or prefetch changed a sample"
    c = run(seed=4)
    assert sum(not torch.equal(a[i], c[i]) for i in range(40)) > 20, "the seed does not change the choices"
    wins = t.windows((12, 12, 1), range(40), epoch=0, seed=3)
    assert wins == [window(t, 12, 12, 6, 6, 3, 0, i) for i in range(40)]
    assert len(set(wins)) > 10 and {w[2] for w in wins} == {False, True}


def test_resume_reproduces_transformed_batches(images, fp):
    x, ds = images(50, (10, 11, 3))
    t = CropMirrorNormalize(MEAN, STD, crop=(8, 8), random_crop=True, mirror=0.5)
    full = fp.loader(ds, 6, shuffle=True, seed=2, transforms={"image": t})
    ref = [fp.epoch(full) for _ in range(2)]
    a = fp.loader(ds, 6, shuffle=True, seed=2, transforms={"image": t})
    fp.epoch(a)
    it = iter(a)
    fp.take(it, 3)
    b = fp.loader(ds, 6, shuffle=True, seed=2, transforms={"image": t})
    b.load_state_dict(a.state_dict())
    assert fp.same_batches(fp.epoch(b), ref[1][3:])
    assert not fp.same_batches(ref[0], ref[1])


@pytest.mark.parametrize("io", ["mmap", "pread", "direct"])
def test_every_io_mode(images, fp, io):
    x, ds = images(33, (9, 7, 3))
    t = CropMirrorNormalize(MEAN, STD, crop=(5, 5), random_crop=True, mirror=0.5)
    ld = fp.quiet_loader(ds, 4, shuffle=True, seed=1, io=io, transforms={"image": t})
    for b in ld:
        idx = b["idx"].numpy()
        check(b["image"], reference(t, x[idx], idx, 1, 0), torch.float32)


def test_tuple_datasets_take_positions(tmp_path, rng, fp):
    x = rng.integers(0, 256, size=(9, 4, 4, 2), dtype=np.uint8)
    np.save(tmp_path / "x.npy", x)
    t = CropMirrorNormalize((0.1, 0.9), (0.3, 0.5))
    single = fp.loader(fastpipe.NpyDataset(str(tmp_path / "x.npy")), 9, transforms={0: t})
    (batch,) = list(single)
    check(batch, reference(t, x, np.arange(9), 0, 0), torch.float32)
    pair = fp.loader(fastpipe.NpyDataset([str(tmp_path / "x.npy")] * 2), 9, transforms={1: t})
    ((raw, norm),) = list(pair)
    assert raw.dtype == torch.uint8 and raw.numpy().tobytes() == x.tobytes()
    check(norm, reference(t, x, np.arange(9), 0, 0), torch.float32)


def test_errors_name_the_field_and_the_reason(tmp_path, images, fp):
    x, ds = images(10, (6, 6, 3))
    np.save(tmp_path / "f.npy", np.zeros((10, 6, 6, 3), np.float32))
    np.save(tmp_path / "flat.npy", np.zeros((10, 108), np.uint8))
    t = CropMirrorNormalize(MEAN, STD)
    with pytest.raises(KeyError, match="'label' is not a field"):
        fp.loader(ds, 2, transforms={"label": t})
    with pytest.raises(TypeError, match="takes uint8 images, the column is torch.float32"):
        fp.loader(fastpipe.NpyDataset(str(tmp_path / "f.npy")), 2, transforms={0: t})
    with pytest.raises(ValueError, match="images of 3 dimensions"):
        fp.loader(fastpipe.NpyDataset(str(tmp_path / "flat.npy")), 2, transforms={0: t})
    with pytest.raises(ValueError, match="the crop 7x7 does not fit in images of 6x6"):
        fp.loader(ds, 2, transforms={"image": CropMirrorNormalize(MEAN, STD, crop=(7, 7))})
    with pytest.raises(ValueError, match="3 channels but mean has 2 values"):
        fp.loader(ds, 2, transforms={"image": CropMirrorNormalize((0.1, 0.2), (0.3, 0.4))})
    with pytest.raises(TypeError, match="transforms must be a dict"):
        fp.loader(ds, 2, transforms=[t])
    with pytest.raises(ValueError, match="TokenDataset takes no transforms"):
        (tmp_path / "t.bin").write_bytes(np.arange(100, dtype=np.uint16).tobytes())
        fp.loader(fastpipe.TokenDataset(str(tmp_path / "t.bin"), 8), 2, transforms={0: t})
    for bad, match in [(dict(std=0), r"std\[0\] must be positive"), (dict(mirror=1.5), r"mirror must be in \[0.0, 1.0\]"),
                       (dict(crop=(3,)), "crop must be None or"), (dict(out_dtype=torch.int8), "out_dtype"),
                       (dict(layout="CHW"), "layout must be"), (dict(in_layout="NHWC"), "in_layout must be")]:
        with pytest.raises((ValueError, TypeError), match=match):
            CropMirrorNormalize(**{"mean": 0.5, "std": 0.5, **bad})


@pytest.mark.parametrize("name", ["TrivialAugmentWide", "RandAugment", "AutoAugment", "AugMix"])
def test_augmentations_without_torchvision_name_the_extra_and_the_torch_to_keep(monkeypatch, name):
    """The policies read torchvision's op tables: without it, the error says how to install it without
    replacing the torch fastpipe was built against (torchvision's wheels pin one torch)."""
    import fastpipe.transforms as T

    for mod in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "torchvision", None)  # `import torchvision` raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'fastpipe\[vision\]' torch==" +
                       torch.__version__.split("+")[0].replace(".", r"\.") + " "):
        getattr(T, name)()
