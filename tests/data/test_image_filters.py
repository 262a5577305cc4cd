"""The resize's bicubic and nearest filters (fastpipe.transforms' ``interpolation`` and ``resize_as``)
against the path a torchvision pipeline runs them on, on the same files: torchvision's own functional
ops on a PIL image (PIL's Image.resize: resize_as="pil"), on a uint8 tensor in v2 (torch's uint8 kernels:
"torch_uint8") and in v1 (torch's float kernels, clamped and rounded: "torch_float"). Within one level
everywhere without DCT scaling, on the CPU and on the simulated device (whose kernel code sums them per
output element).
"""

import numpy as np
import pytest
import torch

import fastpipe
from fastpipe.data import _device
from fastpipe.transforms import CenterCrop, RandomResizedCrop

from jpegs import jpeg_bytes, picture, pil_rgb, write

tv = pytest.importorskip("torchvision")
F1 = tv.transforms.functional
F2 = pytest.importorskip("torchvision.transforms.v2.functional")
IM = tv.transforms.InterpolationMode
pytestmark = [pytest.mark.timeout(180, method="thread"), pytest.mark.torch_build]
SIZES = [(75, 100), (100, 75), (61, 89), (40, 40), (90, 31), (23, 57)]
CASES = [(i, a) for i in ("bicubic", "nearest") for a in ("pil", "torch_uint8", "torch_float")]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    rng = np.random.default_rng()
    root = tmp_path_factory.mktemp("filters")
    paths = [write(str(root / f"c{k % 2}" / f"{k}.jpg"), jpeg_bytes(picture(rng, h, w, grain=40), subsampling=k % 3))
             for k, (h, w) in enumerate(SIZES)]
    ds = fastpipe.ImageFolder(str(root), cache_dir="off")
    return ds, sorted(paths)


def _input(path, resize_as):
    im = pil_rgb(path)
    return im if resize_as == "pil" else F1.pil_to_tensor(im)


def _hwc(x):
    return np.asarray(x) if not isinstance(x, torch.Tensor) else x.permute(1, 2, 0).numpy()


def reference_rrc(path, box, size, interpolation, resize_as):
    top, left, h, w, flip = box
    F = F2 if resize_as == "torch_uint8" else F1
    out = F.resized_crop(_input(path, resize_as), top, left, h, w, list(size), interpolation=IM(interpolation),
                         antialias=True)
    out = F.hflip(out) if flip else out
    return _hwc(out)


def reference_center(path, size, resize, interpolation, resize_as):
    F = F2 if resize_as == "torch_uint8" else F1
    out = F.resize(_input(path, resize_as), resize, interpolation=IM(interpolation), antialias=True)
    return _hwc(F.center_crop(out, list(size)))


def loader_images(ds, transform, device=False, **kw):
    if not device:
        ld = fastpipe.Loader(ds, batch_size=len(ds), transforms={0: transform}, timeout=60, **kw)
        return next(iter(ld))[0].permute(0, 2, 3, 1).numpy().copy()
    with _device.simulated(max_delay_us=50, seed=3) as sim:
        ld = fastpipe.Loader(ds, batch_size=len(ds), transforms={0: transform}, timeout=60, device="cuda",
                             image_decode="device", **kw)
        x = next(iter(ld))[0]
        sim.synchronize(sim.consumer_stream())
        out = x.permute(0, 2, 3, 1).numpy().copy()
        stats = ld.stats()
        del ld, x
        sim.drain()
        assert not sim.misuses()
    assert stats["images_decoded_on_device"] > 0  # the kernel's code ran
    return out


def assert_within_a_level(got, want, what):
    diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
    assert got.shape == want.shape, what
    assert diff.max() <= 1, f"{what}: {int((diff > 1).sum())} values more than a level off (max {diff.max()})"
    assert (diff > 0).mean() < 0.02, f"{what}: {(diff > 0).mean():.2%} of the values differ"


@pytest.mark.parametrize("interpolation,resize_as", CASES)
def test_random_resized_crop_matches_torchvision(folder, interpolation, resize_as):
    ds, paths = folder
    # Small crops enlarged and whole images shrunk, in one epoch.
    t = RandomResizedCrop((37, 29), scale=(0.05, 1.0), out_dtype=torch.uint8, dct_scaling=False,
                          interpolation=interpolation, resize_as=resize_as)
    got = loader_images(ds, t, seed=11)
    for k, box in enumerate(t.boxes(ds, range(len(ds)), epoch=0, seed=11)):
        want = reference_rrc(paths[k], box, t.size, interpolation, resize_as)
        assert_within_a_level(got[k], want, f"image {k} box {box}")


@pytest.mark.parametrize("interpolation,resize_as", CASES)
@pytest.mark.parametrize("resize,size", [(44, (40, 40)), (130, (96, 72)), ((50, 61), (50, 61))])
def test_resize_center_crop_matches_torchvision(folder, interpolation, resize_as, resize, size):
    ds, paths = folder
    t = CenterCrop(size, resize=resize, out_dtype=torch.uint8, dct_scaling=False, interpolation=interpolation,
                   resize_as=resize_as)
    got = loader_images(ds, t)
    for k in range(len(ds)):
        want = reference_center(paths[k], size, resize, interpolation, resize_as)
        assert_within_a_level(got[k], want, f"image {k}")


@pytest.mark.parametrize("interpolation,resize_as", CASES)
def test_the_device_kernel_computes_what_the_host_computes(folder, interpolation, resize_as):
    ds, _ = folder
    for t in (RandomResizedCrop(31, scale=(0.2, 1.0), out_dtype=torch.uint8, dct_scaling=False,
                                interpolation=interpolation, resize_as=resize_as),
              CenterCrop(40, resize=44, out_dtype=torch.uint8, dct_scaling=False, interpolation=interpolation,
                         resize_as=resize_as)):
        host = loader_images(ds, t, seed=4)
        dev = loader_images(ds, t, device=True, seed=4)
        if resize_as == "torch_float" and interpolation == "bicubic":
            # Float sums in another order: a value on a rounding tie may move by a level.
            assert np.abs(host.astype(np.int16) - dev).max() <= 1
            assert (host != dev).mean() < 0.01
        else:
            np.testing.assert_array_equal(dev, host)


def test_normalised_outputs_are_the_rounded_resize_normalised(folder):
    """The bicubic output is the uint8 image torchvision's resize leaves, then normalised (as ToDtype and
    Normalize after it compute it): not the resize's unrounded sums."""
    ds, _ = folder
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    common = dict(dct_scaling=False, interpolation="bicubic", resize_as="torch_float")
    levels = loader_images(ds, CenterCrop(40, resize=44, out_dtype=torch.uint8, **common))
    normed = loader_images(ds, CenterCrop(40, resize=44, mean=mean, std=std, **common))
    want = (levels.astype(np.float64) / 255 - np.array(mean)) / np.array(std)
    np.testing.assert_allclose(normed, want, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("interpolation,resize_as", CASES)
def test_the_gpu_kernel_computes_what_the_host_computes(tmp_path, interpolation, resize_as):
    """nvJPEG decodes 4:4:4 JPEGs to libjpeg-turbo's bytes (an H200), so the kernel's sums meet the host's:
    the fixed-point ones exactly, the float ones within a level (their order differs)."""
    ok, why = fastpipe._ext._C.nvjpeg_status(torch.cuda.current_device(), _device.nvjpeg_library())
    if not ok:
        pytest.skip(f"nvJPEG unavailable: {why}")
    rng = np.random.default_rng()
    for k, (h, w) in enumerate(SIZES):
        write(str(tmp_path / f"c{k % 2}" / f"{k}.jpg"), jpeg_bytes(picture(rng, h, w, grain=40), subsampling=0))
    ds = fastpipe.ImageFolder(str(tmp_path), cache_dir="off")
    for t in (RandomResizedCrop(31, scale=(0.2, 1.0), out_dtype=torch.uint8, dct_scaling=False,
                                interpolation=interpolation, resize_as=resize_as),
              CenterCrop(40, resize=44, out_dtype=torch.uint8, dct_scaling=False, interpolation=interpolation,
                         resize_as=resize_as)):
        host = loader_images(ds, t, seed=4)
        ld = fastpipe.Loader(ds, batch_size=len(ds), transforms={0: t}, seed=4, device="cuda", image_decode="device")
        dev = next(iter(ld))[0].permute(0, 2, 3, 1).cpu().numpy()
        assert ld.stats()["images_decoded_on_device"] > 0
        diff = np.abs(host.astype(np.int16) - dev)
        assert diff.max() <= 1, (t, int((diff > 1).sum()))
