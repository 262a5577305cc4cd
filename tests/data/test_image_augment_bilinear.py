"""The fused augmentations' geometric ops sampled bilinearly (interpolation="bilinear", as torchvision's
classification references pass it to TrivialAugmentWide, RandAugment and AutoAugment): shear, translate
and rotate against torchvision's v2 and v1 kernels with no fill, a fill and a fractional one, the Loader's
outputs against torchvision's ops on the resized image, on the CPU and the simulated device."""

import numpy as np
import pytest
import torch

import fastpipe
from fastpipe._ext import _C
from fastpipe.augment import OPS
from fastpipe.torch_rounding import affine_rounding
from fastpipe.transforms import AutoAugment, RandAugment, RandomResizedCrop, TrivialAugmentWide

from per_sample import device_outputs, jpeg_root, outputs, torchvision_op, untailed

pytest.importorskip("torchvision")
pytestmark = [pytest.mark.timeout(180, method="thread"), pytest.mark.torch_build]

GEOMETRIC = {
    "ShearX": [0.3, -0.99, 0.05, 0.5], "ShearY": [0.3, -0.99, 0.05, 0.5],
    "TranslateX": [31.9, -12.0, 5.5, 300.0], "TranslateY": [31.9, -12.0, 5.5, -300.0],
    "Rotate": [30.0, -135.0, 90.0, 180.0, 13.5, 270.0, 45.0],
}
FILLS = [None, (128.0, 7.0, 255.0), (127.5, 0.25, 3.0), (0.0, 0.0, 0.0)]


def levels(ours, want):
    """(largest difference in levels, values that differ)."""
    d = ours.astype(int) - want.astype(int)
    return int(np.abs(d).max()), int((d != 0).sum())


@pytest.mark.parametrize("name", list(GEOMETRIC))
@pytest.mark.parametrize("size", [(224, 224), (37, 53), (5, 3), (2, 9)], ids=str)
def test_each_geometric_op_is_torchvisions_bilinear_sampling(name, size, rng):
    """Every magnitude, fill and blend (v2's, v1's), with the CPU's FMA and without: torchvision's values."""
    worst, differ, total = 0, 0, 0
    for m in GEOMETRIC[name]:
        m = float(np.float32(m))
        for fill in FILLS:
            for v1 in (False, True):
                img = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
                want = torchvision_op(torch.from_numpy(img).permute(2, 0, 1), name, m,
                                      None if fill is None else list(fill), "bilinear", v1).permute(1, 2, 0).numpy()
                blend = 0 if fill is None else 2 if v1 else 1
                for emulate in (False, True):
                    ours = _C._augment_apply(img, OPS.index(name), m, [round(v) for v in fill or (0, 0, 0)],
                                             emulate_fma=emulate, bilinear=True, blend=blend,
                                             fill_value=list(fill or (0.0, 0.0, 0.0)),
                                             rounding=affine_rounding(*size))
                    w, d = levels(ours, want)
                    worst, differ, total = max(worst, w), differ + d, total + ours.size
    assert worst == 0, (worst, differ, total)


@pytest.fixture
def root(tmp_path, rng):
    return jpeg_root(tmp_path, rng)


@pytest.mark.parametrize("augment", [
    TrivialAugmentWide(interpolation="bilinear"), RandAugment(4, 20, interpolation="bilinear", fill=[200, 10.5, 0]),
    AutoAugment("svhn", interpolation="bilinear", fill=0),
], ids=["ta", "ra4-fill", "aa-svhn-zero-fill"])
@pytest.mark.parametrize("device", [False, True], ids=["cpu", "simulated-device"])
def test_each_output_is_torchvisions_bilinear_ops_on_the_resized_image(root, augment, device):
    """The uint8 output is torchvision's ops (v2, bilinear, the fill as given) with the draws the Loader
    reports on the un-augmented output of the same path (the reader threads', or the device's resample)."""
    ds = fastpipe.ImageFolder(root, cache_dir="off")
    common = dict(size=untailed(31, 32), scale=(0.3, 1.0), out_dtype=torch.uint8, dct_scaling=False)
    t = RandomResizedCrop(augment=augment, **common)
    run = (lambda t: device_outputs(ds, t)[0]) if device else (lambda t: outputs(ds, t))
    plain, got = run(RandomResizedCrop(**common)), run(t)
    fill = None if augment.fill_value is None else list(augment.fill_value)
    geometric = 0
    for epoch, (a, b) in enumerate(zip(plain, got, strict=True)):
        for i, ops in enumerate(t.augmented(range(len(ds)), epoch, seed=4)):
            img = a[i]
            for name, m in ops:
                img = torchvision_op(img, name, m, fill, "bilinear")
                geometric += name in GEOMETRIC and m % 90 != 0
            assert torch.equal(b[i], img), (epoch, i, ops)
    assert geometric >= 3, geometric


def test_the_fill_blend_follows_the_torchvision_version_converted(root):
    """The one-line switch takes v1's blend of a bilinear fill from a v1 step and v2's from a v2 step: each
    Loader equals the fastpipe form with that blend."""
    from fastpipe.data.torchvision_compat import convert_transform

    tv = pytest.importorskip("torchvision")
    ds = fastpipe.ImageFolder(root, cache_dir="off")
    for T in (tv.transforms, pytest.importorskip("torchvision.transforms.v2")):
        step = T.RandAugment(6, 25, interpolation=T.InterpolationMode.BILINEAR, fill=[250, 3, 77.25])
        pipeline = T.Compose([T.CenterCrop(20), step, T.PILToTensor()])
        v1 = T is tv.transforms
        assert convert_transform(pipeline).augment[0].v1_fill == v1
        got = torch.cat([x for x, _ in fastpipe.Loader(tv.datasets.ImageFolder(root, transform=pipeline),
                                                       batch_size=3, seed=2)])
        ours = RandAugment(6, 25, interpolation="bilinear", fill=[250, 3, 77.25])
        ours.v1_fill = v1
        want = outputs(ds, fastpipe.transforms.CenterCrop(20, out_dtype=torch.uint8, augment=ours), seed=2, epochs=1)
        assert torch.equal(got, want[0]), T.__name__
