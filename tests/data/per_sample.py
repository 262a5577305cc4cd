"""A small JPEG folder, every sample's output per epoch (on the CPU and the simulated device) and
torchvision's augmentation ops, for the tests of the per-sample transforms fused after the resize
(test_image_erasing.py, test_image_augment*.py)."""

import math

import torch

import fastpipe
from fastpipe.data import _device

from jpegs import jpeg_bytes, picture, write


def jpeg_root(tmp_path, rng):
    """Seven JPEGs of awkward sizes and all three samplings in two classes; the folder's path."""
    r = tmp_path / "t"
    for k, (h, w) in enumerate([(75, 100), (100, 75), (61, 89), (40, 40), (90, 31), (120, 160), (33, 47)]):
        write(str(r / f"c{k % 2}" / f"{k}.jpg"), jpeg_bytes(picture(rng, h, w), subsampling=k % 3))
    return str(r)


def outputs(ds, t, seed=4, epochs=2, **kw):
    """Every sample's output in each epoch, in sample order, NCHW."""
    ld = fastpipe.Loader(ds, batch_size=3, transforms={0: t}, seed=seed, timeout=60, **kw)
    per_epoch = []
    for _ in range(epochs):
        x = torch.cat([b for b, _ in ld])
        per_epoch.append(x.permute(0, 3, 1, 2) if t.layout == "NHWC" else x)
    return per_epoch


def device_outputs(ds, t, seed=4, epochs=2):
    """outputs() from a device loader decoding on the simulated device; and its stats."""
    with _device.simulated(max_delay_us=100, seed=7) as sim:
        ld = fastpipe.Loader(ds, batch_size=3, transforms={0: t}, seed=seed, timeout=60, device="cuda",
                             image_decode="device")
        per_epoch = []
        for _ in range(epochs):
            got = []
            for x, _ in ld:
                sim.synchronize(sim.consumer_stream())
                got.append(x.cpu())
            x = torch.cat(got)
            per_epoch.append(x.permute(0, 3, 1, 2) if t.layout == "NHWC" else x)
        stats = ld.stats()
        del ld
        sim.drain()
        assert not sim.misuses()
    return per_epoch, stats


def torch_tail(h, w):
    """H x W x 3 mask of the values of torchvision's blends (colour, contrast, sharpness, the grey) that
    ATen's CPU loops may compute in their scalar tail, where a * alpha + b is not fused as in the
    vectorised body: the last n mod 32 of each plane's n = H * W and of the image's 3 H W (32: two AVX-512
    vectors of floats; AVX2's 16 divide it). fastpipe rounds as the body does (a known difference: a value
    there can be a level away)."""
    import numpy as np

    mask = np.zeros((3, h * w), dtype=bool)
    mask[:, h * w - (h * w) % 32:] = True
    flat = mask.reshape(-1)
    flat[3 * h * w - (3 * h * w) % 32:] = True
    return mask.reshape(3, h, w).transpose(1, 2, 0)


def untailed(h, w):
    """(h, w) for a test that compares a chain of ops with torchvision's exactly: an image with no scalar
    tail (torch_tail: H * W a multiple of 32), where ATen computes every blend in its vectorised body,
    as fastpipe does. The per-op tests cover the awkward sizes, with the tail's level allowed."""
    assert (h * w) % 32 == 0, f"{h}x{w} has a scalar tail in ATen's loops: blends there may round a level apart"
    return h, w


def assert_blend_equal(ours, want, msg):
    """HWC uint8 arrays equal but, by at most a level, in torch's scalar tail (torch_tail)."""
    import numpy as np

    d = np.abs(ours.astype(int) - want.astype(int))
    tail = torch_tail(*ours.shape[:2])
    assert d[~tail].max(initial=0) == 0 and d.max(initial=0) <= 1, (msg, int((d != 0).sum()))


def gpu_outputs(ds, t, seed=4, epochs=3):
    """outputs() from a device loader decoding on the GPU (skipped where nvJPEG is unavailable)."""
    import pytest

    ok, why = fastpipe._ext._C.nvjpeg_status(torch.cuda.current_device(), _device.nvjpeg_library())
    if not ok:
        pytest.skip(f"nvJPEG unavailable: {why}")
    ld = fastpipe.Loader(ds, batch_size=3, transforms={0: t}, seed=seed, timeout=60, device="cuda",
                         image_decode="device")
    out = [torch.cat([x for x, _ in ld]).cpu() for _ in range(epochs)]
    assert ld.stats()["images_decoded_on_device"] > 0
    return out


def torchvision_op(img, name, m, fill=None, interpolation="nearest", v1=False):
    """torchvision's op on a CHW uint8 tensor, called as its _AutoAugmentBase calls it (v1: the functional
    ops of torchvision.transforms, whose bilinear fill blends in another order)."""
    from torchvision.transforms import functional as F1
    from torchvision.transforms.v2 import InterpolationMode, functional as F2

    F = F1 if v1 else F2
    geometric = dict(interpolation=InterpolationMode(interpolation), fill=fill)
    if name == "ShearX":
        return F.affine(img, angle=0.0, translate=[0, 0], scale=1.0, shear=[math.degrees(math.atan(m)), 0.0],
                        center=[0, 0], **geometric)
    if name == "ShearY":
        return F.affine(img, angle=0.0, translate=[0, 0], scale=1.0, shear=[0.0, math.degrees(math.atan(m))],
                        center=[0, 0], **geometric)
    if name in ("TranslateX", "TranslateY"):
        shift = [int(m), 0] if name == "TranslateX" else [0, int(m)]
        return F.affine(img, angle=0.0, translate=shift, scale=1.0, shear=[0.0, 0.0], **geometric)
    return {
        "Identity": lambda: img,
        "Rotate": lambda: F.rotate(img, angle=m, **geometric),
        "Brightness": lambda: F2.adjust_brightness(img, 1.0 + m),
        "Color": lambda: F2.adjust_saturation(img, 1.0 + m),
        "Contrast": lambda: F2.adjust_contrast(img, 1.0 + m),
        "Sharpness": lambda: F2.adjust_sharpness(img, 1.0 + m),
        "Posterize": lambda: F2.posterize(img, int(m)),
        "Solarize": lambda: F2.solarize(img, 255.0 * m),
        "AutoContrast": lambda: F2.autocontrast(img),
        "Equalize": lambda: F2.equalize(img),
        "Invert": lambda: F2.invert(img),
    }[name]()
