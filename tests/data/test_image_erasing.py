"""RandomErasing fused into the JPEG transforms' output (fastpipe.transforms.RandomErasing, csrc/kernels/
random_erasing.h): each sample's output is torchvision's ``erase`` of the un-erased output on the box the
Loader draws, the boxes are drawn as torchvision's get_params draws them, and a torchvision pipeline ending
in RandomErasing switches in one line."""

import numpy as np
import pytest
import torch

import fastpipe
from fastpipe.transforms import CenterCrop, RandomErasing, RandomResizedCrop

from per_sample import jpeg_root, outputs

tv = pytest.importorskip("torchvision")
T1 = tv.transforms
T2 = pytest.importorskip("torchvision.transforms.v2")
F2 = T2.functional
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
pytestmark = [pytest.mark.timeout(120, method="thread"), pytest.mark.torch_build]


@pytest.fixture
def root(tmp_path, rng):
    return jpeg_root(tmp_path, rng)


@pytest.mark.parametrize("make", [
    lambda e: RandomResizedCrop(24, scale=(0.3, 1.0), mean=MEAN, std=STD, erase=e),
    lambda e: RandomResizedCrop((20, 31), layout="NHWC", out_dtype=torch.bfloat16, mean=MEAN, std=STD, erase=e),
    lambda e: CenterCrop(22, resize=26, out_dtype=torch.uint8, erase=e),
], ids=["rrc", "rrc-nhwc-bf16", "center-uint8"])
def test_each_output_is_torchvision_erase_on_its_box(root, make):
    ds = fastpipe.ImageFolder(root, cache_dir="off")
    value = (128.0, 3.0, 250.0) if make(None).out_dtype == torch.uint8 else (0.5, -1.25, 2.0)
    erasing = make(RandomErasing(p=0.8, scale=(0.05, 0.5), value=value))
    plain, erased = outputs(ds, make(None)), outputs(ds, erasing)
    seen = 0
    for epoch, (a, b) in enumerate(zip(plain, erased, strict=True)):
        boxes = erasing.erased(range(len(ds)), epoch, seed=4)
        for i, (top, left, h, w) in enumerate(boxes):
            v = torch.tensor(value, dtype=a.dtype).view(3, 1, 1)
            want = F2.erase(a[i], top, left, h, w, v) if h else a[i]
            assert torch.equal(b[i], want), (epoch, i, (top, left, h, w))
            seen += h > 0
    assert seen >= 2


def test_boxes_are_drawn_as_torchvision_draws_them():
    """Frequencies and moments of our boxes against torchvision's own get_params on the same output size
    (small, so that some tries do not fit and the box is left out, as torchvision leaves it)."""
    n, (oh, ow), p, scale, ratio = 6000, (12, 20), 0.6, (0.05, 0.6), (0.3, 3.3)
    ours = RandomResizedCrop((oh, ow), erase=RandomErasing(p, scale, ratio)).erased(range(n), epoch=3, seed=11)
    torch.manual_seed(0)
    img = torch.zeros(3, oh, ow)
    theirs = []
    for _ in range(n):  # torchvision's forward: rand(1) < p, then get_params
        if torch.rand(1) >= p:
            theirs.append((0, 0, 0, 0))
            continue
        i, j, h, w, _ = T1.RandomErasing.get_params(img, scale=scale, ratio=ratio, value=[0.0])
        theirs.append((i, j, h, w) if (h, w) != (oh, ow) else (0, 0, 0, 0))  # no try fitted: nothing erased

    def facts(boxes):
        b = np.array(boxes, dtype=float)
        e = b[b[:, 2] > 0]
        return {"erased": len(e) / len(b), "area": (e[:, 2] * e[:, 3]).mean() / (oh * ow),
                "log_aspect": np.log(e[:, 2] / e[:, 3]).mean(), "top": (e[:, 0] / (oh - e[:, 2] + 1)).mean(),
                "left": (e[:, 1] / (ow - e[:, 3] + 1)).mean()}, e

    (f_ours, e_ours), (f_theirs, e_theirs) = facts(ours), facts(theirs)
    assert ((e_ours[:, 2] < oh) & (e_ours[:, 3] < ow) & (e_ours[:, 0] + e_ours[:, 2] <= oh)).all()
    assert (e_ours[:, 1] + e_ours[:, 3] <= ow).all()
    sd = np.sqrt(p * (1 - p) / n)
    assert abs(f_ours["erased"] - f_theirs["erased"]) < 5 * sd * np.sqrt(2), (f_ours, f_theirs)
    for k, spread in (("area", 0.15), ("log_aspect", 0.8), ("top", 0.3), ("left", 0.3)):
        se = spread / np.sqrt(min(len(e_ours), len(e_theirs)))
        assert abs(f_ours[k] - f_theirs[k]) < 5 * se * np.sqrt(2), (k, f_ours, f_theirs)


def test_new_boxes_each_epoch_and_none_without_erasing():
    t = RandomResizedCrop(32, erase=RandomErasing(p=1.0))
    assert t.erased(range(50), 0) != t.erased(range(50), 1)
    assert t.erased(range(50), 0) == t.erased(range(50), 0)
    assert set(RandomResizedCrop(32).erased(range(20), 0)) == {(0, 0, 0, 0)}
    assert set(RandomResizedCrop(32, erase=RandomErasing(p=0.0)).erased(range(20), 0)) == {(0, 0, 0, 0)}


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="random"):
        RandomErasing(value="random")
    with pytest.raises(ValueError, match="scale must be within"):
        RandomErasing(scale=(0.1, 1.5))
    with pytest.raises(ValueError, match="p must be"):
        RandomErasing(p=1.5)
    with pytest.raises(ValueError, match="1 or 3 values"):
        RandomErasing(value=(1.0, 2.0))
    with pytest.raises(TypeError, match="erase must be a fastpipe.transforms.RandomErasing"):
        RandomResizedCrop(32, erase=T2.RandomErasing())


@pytest.mark.parametrize("T", [T1, T2], ids=["v1", "v2"])
def test_torchvision_reference_train_pipeline_switches_in_one_line(root, T):
    """torchvision's classification reference ends with RandomErasing after Normalize: it is fused."""
    to_float = [T.ToTensor()] if T is T1 else [T2.PILToTensor(), T2.ToDtype(torch.float32, scale=True)]
    pipeline = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), *to_float, T.Normalize(MEAN, STD),
                          T.RandomErasing(p=0.5, value=0)])
    ds = tv.datasets.ImageFolder(root, transform=pipeline)
    got = torch.cat([x for x, _ in fastpipe.Loader(ds, batch_size=3, seed=4)])
    fused = RandomResizedCrop(24, mirror=0.5, mean=MEAN, std=STD, erase=RandomErasing(p=0.5))
    want = torch.cat([x for x, _ in fastpipe.Loader(fastpipe.ImageFolder(root, cache_dir="off"), batch_size=3,
                                                    seed=4, transforms={0: fused})])
    assert torch.equal(got, want)
    for bad, match in ((T.RandomErasing(value="random"), "value='random'"),):
        with pytest.raises(ValueError, match=match):
            fastpipe.Loader(tv.datasets.ImageFolder(root, transform=T.Compose([*pipeline.transforms[:-1], bad])),
                            batch_size=2)
    after = T.Compose([*pipeline.transforms, T.RandomHorizontalFlip()])
    with pytest.raises(ValueError, match="after RandomErasing"):
        fastpipe.Loader(tv.datasets.ImageFolder(root, transform=after), batch_size=2)


@pytest.mark.gpu
def test_on_a_gpu_the_resample_kernel_erases_the_same_boxes(root):
    """The device decode's kernel (image_transform.h: resample_element) erases each sample's box as the
    reader threads do: the box's elements are the value exactly, the rest nvJPEG's decode resampled."""
    from fastpipe.data import _device

    ok, why = fastpipe._ext._C.nvjpeg_status(torch.cuda.current_device(), _device.nvjpeg_library())
    if not ok:
        pytest.skip(f"nvJPEG unavailable: {why}")
    ds = fastpipe.ImageFolder(root, cache_dir="off")
    value = (1.0, -2.0, 0.5)
    t = RandomResizedCrop(24, scale=(0.3, 1.0), dct_scaling=False, mean=MEAN, std=STD,
                          erase=RandomErasing(0.8, scale=(0.05, 0.5), value=value))
    cpu = outputs(ds, t)
    ld = fastpipe.Loader(ds, batch_size=3, transforms={0: t}, seed=4, timeout=60, device="cuda",
                         image_decode="device")
    for epoch, want in enumerate(cpu):
        got = torch.cat([x for x, _ in ld]).cpu()
        assert ld.stats()["images_decoded_on_device"] > 0
        for i, (top, left, h, w) in enumerate(t.erased(range(len(ds)), epoch, seed=4)):
            inside = torch.zeros(want.shape[2:], dtype=torch.bool)
            inside[top:top + h, left:left + w] = True
            for c in range(3):
                assert (got[i, c][inside] == value[c]).all() and (want[i, c][inside] == value[c]).all()
            levels = ((got[i][:, ~inside] - want[i][:, ~inside]) * torch.tensor(STD).view(3, 1) * 255).abs()
            assert float(levels.mean()) <= 1.0 and float(levels.quantile(0.99)) <= 4.0  # nvJPEG's own IDCT
