"""RandomCrop with padding on image records: fastpipe.transforms.RandomCrop(padding=..., pad_if_needed=...)
and torchvision's RandomCrop given to the Loader in a torchvision ImageFolder (CIFAR's recipe on image files,
Tiny-ImageNet's RandomCrop(64, padding=4)). Each output is the crop of the zero-padded (resized) image at the
place boxes() reports, and the places are drawn as torchvision draws them: uniformly in the padded image."""

import numpy as np
import pytest
import torch

import fastpipe
from fastpipe.data import torchvision_compat
from fastpipe.transforms import RandomCrop

from jpegs import assert_on_boxes, make_tree, reference_padded_crop

pytestmark = pytest.mark.timeout(180, method="thread")
# CIFAR's and Tiny-ImageNet's sizes, odd ones, one narrower than the crops below, one of a pixel.
SIZES = [(32, 32), (64, 64), (37, 45), (97, 131), (20, 50), (1, 1), (33, 301)]


@pytest.fixture
def folder(tmp_path, rng):
    root = tmp_path / "tree"
    make_tree(str(root), rng, SIZES)
    return fastpipe.ImageFolder(str(root), cache_dir=str(tmp_path / "cache"))


def outputs(ds, t, seed, epoch):
    ld = fastpipe.Loader(ds, batch_size=3, transforms={0: t}, seed=seed, timeout=60)
    ld.set_epoch(epoch)
    return [x.clone() for xs, _ in ld for x in xs]


def padded_crop(size, resize):
    """The reference of a box boxes() reports: the padded crop of that size at its place, flipped or not."""
    def reference(im, box):
        top, left, h, w, flip = box
        assert (h, w) == size
        return reference_padded_crop(im, size, resize, top, left, flip)
    return reference


def check_on_places(folder, t, size, resize, seed):
    """Two epochs of ``t``: each output within a level of the padded crop at the place boxes() reports."""
    for epoch in range(2):
        assert_on_boxes(folder.samples, outputs(folder, t, seed, epoch),
                        t.boxes(folder, range(len(folder)), epoch, seed=seed), padded_crop(size, resize))


@pytest.mark.parametrize("padding,pad_if_needed,resize", [
    (4, False, None),             # CIFAR's
    ((3, 1), False, 48),          # left/right 3, top/bottom 1, after a Resize
    ((1, 2, 5, 0), True, None),   # left, top, right, bottom; narrow images padded further
    (0, True, (40, 30)),          # pad_if_needed alone: the resize is narrower than the crop
])
def test_padded_crop_matches_torchvision_on_its_places(folder, padding, pad_if_needed, resize):
    size = (36, 34)
    t = RandomCrop(size, resize=resize, padding=padding, pad_if_needed=pad_if_needed, dct_scaling=False)
    check_on_places(folder, t, size, resize, seed=7)


def places(t, hw, n=4000, epoch=0):
    return (np.array(v) for v in zip(*[(b[0], b[1]) for b in t.boxes([hw] * n, range(n), epoch)]))


@pytest.mark.parametrize("padding,pad_if_needed,hw,size,top_range,left_range", [
    # torchvision: the image padded, then i = randint(0, H + pads - h + 1); the place is i - top padding.
    (4, False, (32, 32), (32, 32), (-4, 4), (-4, 4)),
    ((1, 2, 3, 4), False, (32, 32), (32, 32), (-2, 4), (-1, 3)),
    # pad_if_needed: an axis still shorter than the crop is padded by the difference on both sides.
    (0, True, (20, 50), (32, 32), (-12, 0), (0, 18)),
    ((2, 1), True, (20, 50), (32, 32), (-11, -1), (-2, 20)),
])
def test_places_are_uniform_over_the_padded_image(padding, pad_if_needed, hw, size, top_range, left_range):
    t = RandomCrop(size, padding=padding, pad_if_needed=pad_if_needed)
    tops, lefts = places(t, hw)
    for name, v, (lo, hi) in (("top", tops, top_range), ("left", lefts, left_range)):
        assert v.min() == lo and v.max() == hi, f"{name} spans [{v.min()}, {v.max()}], not [{lo}, {hi}]"
        counts = np.bincount(v - lo, minlength=hi - lo + 1)
        expected = len(v) / (hi - lo + 1)
        assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected)), f"{name} counts {counts}"


def test_a_crop_larger_than_the_padded_image_is_centred():
    """torchvision raises there; the fused crop pads as CenterCrop does, the place fixed."""
    t = RandomCrop((32, 32), padding=2)
    tops, lefts = places(t, (20, 50), n=200)
    assert set(tops.tolist()) == {-6} and lefts.min() == -2 and lefts.max() == 20


@pytest.mark.parametrize("padding,match", [
    (-1, "padding must be at least 0"),
    ((1, 2, 3), "sequence of 1, 2 or 4"),
    (1.5, "padding must be an int"),
    (1 << 20, "padding must be at most"),
])
def test_bad_padding_is_refused(padding, match):
    with pytest.raises((ValueError, TypeError), match=match):
        RandomCrop(32, padding=padding)


tv = pytest.importorskip("torchvision")
T1 = pytest.importorskip("torchvision.transforms")
T2 = pytest.importorskip("torchvision.transforms.v2")


@pytest.mark.parametrize("crop,sides", [
    (lambda T: [T.RandomCrop(36, padding=4)], (4, 4, 4, 4)),
    (lambda T: [T.RandomCrop(36, padding=(1, 2, 3, 5), pad_if_needed=True, fill=(0, 0, 0))], (1, 2, 3, 5)),
    (lambda T: [T.Pad((1, 2, 3, 1)), T.RandomCrop(36, padding=(2, 1))], (3, 3, 5, 2)),  # a Pad's sides added
], ids=["padding 4", "left top right bottom, pad_if_needed", "pad then crop"])
@pytest.mark.parametrize("T", [T1, T2], ids=["v1", "v2"])
def test_torchvision_random_crop_with_padding_is_fused(folder, T, crop, sides):
    """The recipes' RandomCrop(padding) + RandomHorizontalFlip + ToTensor: fused with the same padding on
    either side, each image the padded crop at the place the fused transform reports."""
    steps = crop(T) + [T.RandomHorizontalFlip()] + ([T.ToTensor()] if T is T1 else
                                                   [T.ToImage(), T.ToDtype(torch.float32, scale=True)])
    ds = tv.datasets.ImageFolder(folder.root, transform=T.Compose(steps))
    fused = torchvision_compat.convert_transform(ds.transform)
    assert isinstance(fused, RandomCrop) and fused.padding == sides and fused.mirror == 0.5
    assert fused.pad_if_needed == (sides == (1, 2, 3, 5))
    got = [x for xs, _ in fastpipe.Loader(ds, batch_size=3, seed=5) for x in xs]
    assert_on_boxes(ds.samples, got, fused.boxes(folder, range(len(ds)), 0, seed=5), padded_crop((36, 36), None))


@pytest.mark.parametrize("steps,match", [
    (lambda: [T1.RandomCrop(36, padding=4, padding_mode="reflect"), T1.ToTensor()], "padding_mode='reflect'"),
    (lambda: [T1.RandomCrop(36, padding=4, fill=128), T1.ToTensor()], "fill=128"),
    (lambda: [T2.RandomCrop(36, padding=4, fill={tv.tv_tensors.Image: 9}), T2.ToImage(),
              T2.ToDtype(torch.float32, scale=True)], "pads with zeros"),
    (lambda: [T1.ToTensor(), T1.Normalize((0.5,) * 3, (0.2,) * 3), T1.RandomCrop(36, padding=4)],
     "padding after Normalize"),
    (lambda: [T1.RandomHorizontalFlip(), T1.RandomCrop(36, padding=(1, 0, 3, 0)), T1.ToTensor()],
     "after RandomHorizontalFlip"),
    (lambda: [T1.Pad(4), T1.CenterCrop(36), T1.ToTensor()], "after a Pad"),
    (lambda: [T1.Pad(4), T1.ToTensor()], "after a Pad"),
    (lambda: [T1.Pad(4, padding_mode="edge"), T1.RandomCrop(36), T1.ToTensor()], "padding_mode='edge'"),
])
def test_paddings_the_fused_crop_cannot_do_are_named(folder, steps, match):
    with pytest.raises(ValueError, match=match):
        fastpipe.Loader(tv.datasets.ImageFolder(folder.root, transform=T1.Compose(steps())), batch_size=2)
