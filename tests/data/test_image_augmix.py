"""torchvision's AugMix fused into the JPEG transforms (fastpipe.augment.AugMix; csrc/kernels/augment_draws.h's
add_augmix, augment_ops.h's mix_pixel): each output is torchvision's mixing of its chains, replayed with
torchvision's ops and float32 arithmetic from the draws the Loader reports, on the CPU, the simulated
device and a GPU; the draws follow torchvision's own sampling; its pipelines switch in one line."""

import math

import numpy as np
import pytest
import torch

import fastpipe
from fastpipe.transforms import AugMix, RandAugment, RandomResizedCrop

from per_sample import device_outputs, gpu_outputs, jpeg_root, outputs, torchvision_op, untailed

tv = pytest.importorskip("torchvision")
T1 = tv.transforms
T2 = pytest.importorskip("torchvision.transforms.v2")
pytestmark = [pytest.mark.timeout(180, method="thread"), pytest.mark.torch_build]
MIXING = ("MixOriginal", "MixChain", "MixLast")


def augmix_replay(img, ops, augmix):
    """torchvision's AugMix.forward on a CHW uint8 tensor with the reported draws: the mix of the image and
    its chains in float32, truncated to uint8."""
    fill = None if augmix.fill_value is None else list(augmix.fill_value)
    batch = img[None]
    mix, aug = None, batch
    for name, m in ops:
        weight = torch.tensor([m], dtype=torch.float32).reshape(1, 1, 1, 1)
        if name == "MixOriginal":
            mix = weight * batch
        elif name in MIXING:
            mix.add_(weight * aug)
            aug = batch
        else:
            aug = torchvision_op(aug, name, m, fill, augmix.interpolation)
    return mix.reshape(img.shape).to(torch.uint8)


def chains(ops):
    """The ops of each chain, and the mixing weights (the original's first)."""
    out, weights, current = [], [], []
    for name, m in ops:
        if name in MIXING:
            weights.append(m)
            if name != "MixOriginal":
                out.append(current)
                current = []
        else:
            current.append((name, m))
    return out, weights


@pytest.fixture
def root(tmp_path, rng):
    return jpeg_root(tmp_path, rng)


AUGMIXES = [AugMix(), AugMix(severity=7, mixture_width=2, chain_depth=2, alpha=0.4, all_ops=False,
                             interpolation="nearest", fill=[30, 200, 9]),
            AugMix(severity=1, mixture_width=5, chain_depth=1, alpha=3.0, fill=127.5)]


@pytest.mark.parametrize("augmix", AUGMIXES, ids=["default", "partial-nearest-fill", "wide-shallow"])
@pytest.mark.parametrize("device", [False, True], ids=["cpu", "simulated-device"])
def test_each_output_is_torchvisions_mix_of_its_chains(root, augmix, device):
    ds = fastpipe.ImageFolder(root, cache_dir="off")
    common = dict(size=untailed(29, 32), scale=(0.3, 1.0), out_dtype=torch.uint8, dct_scaling=False)
    t = RandomResizedCrop(augment=augmix, **common)
    run = (lambda t: device_outputs(ds, t)[0]) if device else (lambda t: outputs(ds, t))
    plain, got = run(RandomResizedCrop(**common)), run(t)
    changed = 0
    for epoch, (a, b) in enumerate(zip(plain, got, strict=True)):
        for i, ops in enumerate(t.augmented(range(len(ds)), epoch, seed=4)):
            ops_of_chains, weights = chains(ops)
            assert len(ops_of_chains) == augmix.mixture_width and ops[0][0] == "MixOriginal", ops
            depth = augmix.chain_depth
            assert all(len(c) == depth if depth > 0 else 1 <= len(c) <= 3 for c in ops_of_chains), ops
            assert abs(sum(weights) - 1.0) < 1e-5 and min(weights) >= 0.0, weights
            want = augmix_replay(a[i], ops, augmix)
            assert torch.equal(b[i], want), (epoch, i, ops, int((b[i] != want).sum()))
            changed += not torch.equal(b[i], a[i])
    assert changed >= len(ds), changed


def recorded_augmix(transform, n, size):
    """torchvision's own AugMix draws over n calls: per call its ops and its Dirichlet weights
    (the original's share, then each chain's weight, as forward() combines them)."""
    seen = []
    cls = type(transform)
    apply, dirichlet = cls._apply_image_or_video_transform, cls._sample_dirichlet

    def record_op(self, image, transform_id, magnitude, **kw):
        seen[-1][0].append((transform_id, magnitude))
        return image

    def record_weights(self, params):
        out = dirichlet(self, params)
        seen[-1][1].append(out[0].clone())
        return out

    cls._apply_image_or_video_transform, cls._sample_dirichlet = record_op, record_weights
    try:
        torch.manual_seed(0)
        img = torch.zeros(3, *size, dtype=torch.uint8)
        for _ in range(n):
            seen.append(([], []))
            transform(img)
    finally:
        cls._apply_image_or_video_transform, cls._sample_dirichlet = apply, dirichlet
    return [(ops, [float(m[0])] + [float(v) for v in d * m[1]]) for ops, (m, d) in seen]


def agree(a, b, what):
    """Means of two samples within 5 standard errors of their difference."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    se = math.sqrt(a.var() / len(a) + b.var() / len(b)) + 1e-9
    assert abs(a.mean() - b.mean()) < 5 * se, (what, a.mean(), b.mean())


@pytest.mark.parametrize("ours,theirs", [
    (AugMix(), T2.AugMix()),
    (AugMix(severity=9, mixture_width=2, alpha=0.3, all_ops=False), T2.AugMix(9, 2, alpha=0.3, all_ops=False)),
], ids=["default", "partial-sparse"])
def test_the_draws_follow_torchvisions_sampling(ours, theirs):
    """Ops per sample, each op's share and magnitudes, the original's share and the chains' weights (means
    and second moments) against torchvision's AugMix recording its own draws."""
    n, size = 3000, (40, 56)
    t = RandomResizedCrop(size, augment=ours)
    mine = []
    for ops in t.augmented(range(n), epoch=2, seed=8):
        ops_of_chains, weights = chains(ops)
        mine.append(([op for c in ops_of_chains for op in c], weights))
    theirs_draws = recorded_augmix(theirs, n, size)
    for what, pick in (("ops per sample", lambda s: len(s[0])), ("original's share", lambda s: s[1][0]),
                       ("its square", lambda s: s[1][0] ** 2), ("a chain's weight", lambda s: s[1][1]),
                       ("its square", lambda s: s[1][1] ** 2), ("the last chain's", lambda s: s[1][-1])):
        agree([pick(s) for s in mine], [pick(s) for s in theirs_draws], what)
    flat_mine = [op for s in mine for op in s[0]]
    flat_theirs = [op for s in theirs_draws for op in s[0]]
    names = {name for name, _ in flat_theirs}
    assert {name for name, _ in flat_mine} == names
    for name in names:
        agree([op == name for op, _ in flat_mine], [op == name for op, _ in flat_theirs], name)
        agree([abs(m) for op, m in flat_mine if op == name], [abs(m) for op, m in flat_theirs if op == name], name)
        agree([m for op, m in flat_mine if op == name], [m for op, m in flat_theirs if op == name], name)
    table = {round(m, 5) for _, m in flat_theirs}
    assert {round(m, 5) for _, m in flat_mine} <= table | {-m for m in table}


@pytest.mark.parametrize("T", [T1, T2], ids=["v1", "v2"])
def test_augmix_pipelines_switch_in_one_line(root, T):
    """The reference preset's AugMix policy (bilinear, its severity) and one with every argument, handed to
    fastpipe.Loader with torchvision's ImageFolder: the fastpipe form's batches."""
    bilinear = T.InterpolationMode.BILINEAR
    for step, ours in ((T.AugMix(interpolation=bilinear, severity=3), AugMix(severity=3)),
                       (T.AugMix(5, 2, 2, 0.7, False, T.InterpolationMode.NEAREST, [9, 8, 7]),
                        AugMix(5, 2, 2, 0.7, False, "nearest", [9, 8, 7]))):
        pipeline = T.Compose([T.RandomResizedCrop(24, interpolation=bilinear, antialias=True),
                              T.RandomHorizontalFlip(0.5), step, T.PILToTensor()])
        got = torch.cat([x for x, _ in fastpipe.Loader(tv.datasets.ImageFolder(root, transform=pipeline),
                                                       batch_size=3, seed=4)])
        ours.v1_fill = T is T1
        fused = RandomResizedCrop(24, mirror=0.5, out_dtype=torch.uint8, augment=ours)
        want = outputs(fastpipe.ImageFolder(root, cache_dir="off"), fused, epochs=1)[0]
        assert torch.equal(got, want), step


def test_bad_arguments_are_named():
    for kwargs, match in ((dict(severity=11), "severity"), (dict(mixture_width=7), "mixture_width"),
                          (dict(chain_depth=15), "chain_depth"), (dict(alpha=0.0), "alpha"),
                          (dict(mixture_width=5, chain_depth=3), "at most 16"),
                          (dict(interpolation="lanczos"), "'nearest'.*'bilinear' or 'bicubic'")):
        with pytest.raises(ValueError, match=match):
            AugMix(**kwargs)
    with pytest.raises(ValueError, match="at most 16 ops a sample in all, these stages draw up to 17"):
        RandomResizedCrop(32, augment=[AugMix(), RandAugment(num_ops=4, interpolation="bilinear")])


@pytest.mark.gpu
def test_on_a_gpu_the_augmentation_kernel_mixes_as_torchvision(root):
    """The kernel's mixing (the original and the sums in each record's work area) on the GPU's own resized
    images: torchvision's AugMix with the draws the Loader reports, exactly."""
    ds = fastpipe.ImageFolder(root, cache_dir="off")
    common = dict(size=(40, 36), scale=(0.3, 1.0), dct_scaling=False, out_dtype=torch.uint8)
    augmix = AugMix(fill=[1, 2, 3])
    t = RandomResizedCrop(augment=augmix, **common)
    plain, got = gpu_outputs(ds, RandomResizedCrop(**common)), gpu_outputs(ds, t)
    for epoch, (a, b) in enumerate(zip(plain, got, strict=True)):
        for i, ops in enumerate(t.augmented(range(len(ds)), epoch, seed=4)):
            assert torch.equal(b[i], augmix_replay(a[i], ops, augmix)), (epoch, i, ops)
