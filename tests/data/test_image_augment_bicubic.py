"""The fused augmentations' geometric ops sampled bicubically (the references' --interpolation bicubic
passes bicubic to TrivialAugmentWide and the other policies). torchvision's tensor kernels refuse bicubic
for shear, translate and rotate; the reference here is what they compute with the refusal lifted:
torchvision v2's own op (its grid, grid_sample's bicubic, its fill blend), the result clamped to
[0, 255] before the conversion to uint8 (which would wrap bicubic's overshoot around)."""

import numpy as np
import pytest
import torch

import fastpipe
from fastpipe._ext import _C
from fastpipe.augment import OPS
from fastpipe.torch_rounding import affine_rounding
from fastpipe.transforms import RandomResizedCrop, TrivialAugmentWide

from per_sample import device_outputs, jpeg_root, outputs, torchvision_op, untailed

pytest.importorskip("torchvision")
pytestmark = [pytest.mark.timeout(180, method="thread"), pytest.mark.torch_build]
GEOMETRIC = {"ShearX": [0.3, -0.99], "ShearY": [0.05, 0.5], "TranslateX": [31.9, -12.0], "TranslateY": [5.5, -300.0],
             "Rotate": [30.0, -135.0, 90.0, 13.5]}
FILLS = [None, (128.0, 7.0, 255.0), (127.5, 0.25, 3.0)]


@pytest.fixture
def bicubic_torchvision(monkeypatch):
    """torchvision v2's geometric kernels with bicubic allowed and their result clamped."""
    from torchvision.transforms.v2.functional import _geometry as G

    check = G._assert_grid_transform_inputs

    def allow_bicubic(image, matrix, interpolation, fill, supported):
        return check(image, matrix, interpolation, fill, [*supported, "bicubic"])

    def apply_grid_clamped(img, grid, mode, fill):
        float_img = img.to(grid.dtype)
        if fill is not None:
            float_img = torch.cat((float_img, torch.ones_like(float_img[:1])), dim=0)
        float_img = torch.nn.functional.grid_sample(float_img[None], grid, mode=mode, padding_mode="zeros",
                                                    align_corners=False)[0]
        if fill is not None:
            float_img, mask = float_img[:-1], float_img[-1:].expand_as(float_img[:-1])
            fill_img = torch.tensor(fill, dtype=float_img.dtype).view(-1, 1, 1)
            float_img = float_img.sub_(fill_img).mul_(mask).add_(fill_img)
        return float_img.round_().clamp_(0, 255).to(img.dtype)

    monkeypatch.setattr(G, "_assert_grid_transform_inputs", allow_bicubic)
    monkeypatch.setattr(G, "_apply_grid_transform", apply_grid_clamped)


@pytest.mark.parametrize("name", list(GEOMETRIC))
@pytest.mark.parametrize("size", [(64, 64), (37, 53), (5, 3)], ids=str)
def test_each_geometric_op_is_grid_samples_bicubic(name, size, rng, bicubic_torchvision):
    worst, differ, total = 0, 0, 0
    for m in GEOMETRIC[name]:
        m = float(np.float32(m))
        for fill in FILLS:
            img = (rng.random((*size, 3)) < 0.5).astype(np.uint8) * 255  # hard edges: bicubic overshoots
            img[::3] = rng.integers(0, 256, img[::3].shape, dtype=np.uint8)
            want = torchvision_op(torch.from_numpy(img).permute(2, 0, 1), name, m,
                                  None if fill is None else list(fill), "bicubic").permute(1, 2, 0).numpy()
            ours = _C._augment_apply(img, OPS.index(name), m, [round(v) for v in fill or (0, 0, 0)], bicubic=True,
                                     blend=0 if fill is None else 1, fill_value=list(fill or (0.0, 0.0, 0.0)),
                                     rounding=affine_rounding(*size))
            d = np.abs(ours.astype(int) - want.astype(int))
            worst, differ, total = max(worst, int(d.max())), differ + int((d != 0).sum()), total + d.size
    # grid_sample's vectorised kernel and fastpipe's sum the same products; a tie may round apart.
    assert worst <= 1 and differ <= total // 200, (worst, differ, total)


@pytest.mark.parametrize("device", [False, True], ids=["cpu", "simulated-device"])
def test_each_output_is_the_bicubic_ops_on_the_resized_image(tmp_path, rng, device, bicubic_torchvision):
    ds = fastpipe.ImageFolder(jpeg_root(tmp_path, rng), cache_dir="off")
    common = dict(size=untailed(31, 32), scale=(0.3, 1.0), out_dtype=torch.uint8, dct_scaling=False)
    t = RandomResizedCrop(augment=TrivialAugmentWide(interpolation="bicubic", fill=[9, 200, 31]), **common)
    run = (lambda t: device_outputs(ds, t)[0]) if device else (lambda t: outputs(ds, t))
    plain, got = run(RandomResizedCrop(**common)), run(t)
    geometric = 0
    for epoch, (a, b) in enumerate(zip(plain, got, strict=True)):
        for i, ops in enumerate(t.augmented(range(len(ds)), epoch, seed=4)):
            img = a[i]
            for name, m in ops:
                img = torchvision_op(img, name, m, [9.0, 200.0, 31.0], "bicubic")
                geometric += name in GEOMETRIC and m % 90 != 0
            assert int((b[i].int() - img.int()).abs().max()) <= 1, (epoch, i, ops)
    assert geometric >= 2, geometric


def test_the_one_line_switch_takes_bicubic_policies(tmp_path, rng):
    from fastpipe.data.torchvision_compat import convert_transform

    tv = pytest.importorskip("torchvision")
    T = tv.transforms
    pipeline = T.Compose([T.RandomResizedCrop(24, interpolation=T.InterpolationMode.BICUBIC),
                          T.TrivialAugmentWide(interpolation=T.InterpolationMode.BICUBIC), T.PILToTensor()])
    fused = convert_transform(pipeline)
    assert fused.interpolation == "bicubic" and fused.augment[0].interpolation == "bicubic"
    ds = tv.datasets.ImageFolder(jpeg_root(tmp_path, rng), transform=pipeline)
    x, _ = next(iter(fastpipe.Loader(ds, batch_size=7)))
    assert x.shape == (7, 3, 24, 24) and x.dtype == torch.uint8
