"""torchvision's TrivialAugmentWide, RandAugment and AutoAugment fused into the JPEG transforms
(fastpipe.augment, csrc/kernels/augment_ops.h, augment_draws.h): each op equals torchvision's tensor kernel
given the same parameters, each sample's output is torchvision's ops on the resized uint8 image with the
ops the Loader draws, the draws follow torchvision's own sampling, and torchvision's reference train
pipeline switches in one line."""

import math

import numpy as np
import pytest
import torch

import fastpipe
from fastpipe._ext import _C
from fastpipe.augment import OPS
from fastpipe.torch_rounding import affine_rounding
from fastpipe.data import _device
from fastpipe.transforms import AutoAugment, CenterCrop, ColorJitter, GaussianBlur, RandAugment, RandomApply
from fastpipe.transforms import RandomErasing, RandomGrayscale, RandomResizedCrop, TrivialAugmentWide

from jpegs import jpeg_bytes, picture, write
from per_sample import assert_blend_equal, device_outputs, gpu_outputs, jpeg_root, outputs, torchvision_op, untailed

tv = pytest.importorskip("torchvision")
T1 = tv.transforms
T2 = pytest.importorskip("torchvision.transforms.v2")
F2 = T2.functional
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
pytestmark = [pytest.mark.timeout(180, method="thread"), pytest.mark.torch_build]


MAGNITUDES = {
    "Identity": [0.0], "ShearX": [0.3, -0.99, 0.05], "ShearY": [0.3, -0.99, 0.05],
    "TranslateX": [31.9, -12.0, 5.5], "TranslateY": [31.9, -12.0, 5.5],
    "Rotate": [30.0, -135.0, 90.0, -90.0, 180.0, 0.0, 13.5, 270.0],
    "Brightness": [0.5, -0.99, 0.2], "Color": [0.5, -0.99, 0.9], "Contrast": [0.5, -0.99, 0.9],
    "Sharpness": [0.5, -0.99, 0.9], "Posterize": [8.0, 4.0, 2.0, 1.0, 0.0], "Solarize": [1.0, 0.5, 0.0, 0.3333],
    "AutoContrast": [0.0], "Equalize": [0.0], "Invert": [0.0],
}


# The ops whose blends ATen fuses in its vectorised loops and not in their scalar tails (torch_tail).
BLENDS = ("Color", "Contrast", "Sharpness", "Brightness")


@pytest.mark.parametrize("name", list(MAGNITUDES))
@pytest.mark.parametrize("size", [(224, 224), (37, 53), (5, 3), (64, 31), (2, 9)], ids=str)
def test_each_op_equals_torchvision_given_the_same_parameters(name, size, rng):
    """With the CPU's fused multiply-add (where it has one) and with its emulation: the same values."""
    for m in MAGNITUDES[name]:
        m = float(np.float32(m))  # magnitudes are torchvision's float32 table values
        for fill in (None, [128, 7, 255]):
            img = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
            if name in ("AutoContrast", "Equalize", "Contrast"):  # a narrower range, so the op changes it
                img = (img // int(rng.integers(2, 5)) + int(rng.integers(0, 60))).astype(np.uint8)
            want = torchvision_op(torch.from_numpy(img).permute(2, 0, 1), name, m,
                                  None if fill is None else [float(v) for v in fill]).permute(1, 2, 0).numpy()
            for emulate in (False, True):
                ours = _C._augment_apply(img, OPS.index(name), m, fill or [0, 0, 0], emulate_fma=emulate,
                                         rounding=affine_rounding(*size))
                if name in BLENDS:
                    assert_blend_equal(ours, want, (name, m, fill, emulate))
                else:
                    assert np.array_equal(ours, want), (name, m, fill, emulate, int((ours != want).sum()))


FACTOR_FNS = {
    "adjust_brightness": lambda img, f: F2.adjust_brightness(img, f),
    "adjust_contrast": lambda img, f: F2.adjust_contrast(img, f),
    "adjust_saturation": lambda img, f: F2.adjust_saturation(img, f),
    "adjust_hue": lambda img, f: F2.adjust_hue(img, f),
    "rgb_to_grayscale": lambda img, f: F2.rgb_to_grayscale(img, num_output_channels=3),
}
FACTOR_OP = {"adjust_brightness": "Brightness", "adjust_contrast": "Contrast", "adjust_saturation": "Color",
             "adjust_hue": "Hue", "rgb_to_grayscale": "Grayscale"}


def apply_ops(img, ops, fill=None, blur=None):
    """torchvision's functional ops, as the Loader reports them, applied in turn to a CHW uint8 tensor
    (blur: GaussianBlur's kernel size)."""
    for name, m in ops:
        if name == "gaussian_blur":
            img = F2.gaussian_blur(img, list(blur), [m, m])
        else:
            img = FACTOR_FNS[name](img, m) if name in FACTOR_FNS else torchvision_op(img, name, m, fill)
    return img


def blur_levels(ours, want):
    """(largest difference, share of values that differ): a 1-D pass each way sums in another order than
    torchvision's 2-D kernel (the same weights, to a unit or two of the last place)."""
    d = (ours.astype(int) - want.astype(int)) if isinstance(ours, np.ndarray) else (ours.int() - want.int()).numpy()
    return int(np.abs(d).max()), float((d != 0).mean())


@pytest.mark.parametrize("size", [(224, 224), (37, 53), (9, 4)], ids=str)
@pytest.mark.parametrize("kernel", [(23, 23), (3, 7), (1, 5)], ids=str)
def test_gaussian_blur_is_torchvisions_to_a_level(size, kernel, rng):
    if kernel[0] // 2 >= size[1] or kernel[1] // 2 >= size[0]:
        pytest.skip("reflect padding needs the kernel inside the image")
    t = RandomResizedCrop(size, augment=GaussianBlur(kernel, sigma=(0.1, 5.0)))
    sigmas = []
    for ops in t.augmented(range(40), 0, seed=3):
        ((name, sigma),) = ops
        assert name == "gaussian_blur" and 0.1 <= sigma <= 5.0
        sigmas.append(sigma)
    # The share is pooled over at least 20,000 values a mode: on a 9 x 4 image one value is 0.9%.
    images = max(1, 20000 // (6 * size[0] * size[1] * 3))
    worst, shares = {False: 0, True: 0}, {False: [], True: []}
    for sigma in sigmas[:6]:
        for _ in range(images):
            img = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
            want = F2.gaussian_blur(torch.from_numpy(img).permute(2, 0, 1), list(kernel), [sigma, sigma])
            for emulate in (False, True):
                ours = _C._augment_apply(img, OPS.index("Blur"), sigma, [0, 0, 0], emulate_fma=emulate,
                                         by_factor=True, taps=kernel)
                w, share = blur_levels(ours, want.permute(1, 2, 0).numpy())
                worst[emulate] = max(worst[emulate], w)
                shares[emulate].append(share)
    for emulate in (False, True):
        assert worst[emulate] <= 1 and np.mean(shares[emulate]) < 0.005, (emulate, worst, np.mean(shares[emulate]))


@pytest.mark.parametrize("name", list(FACTOR_FNS))
@pytest.mark.parametrize("size", [(224, 224), (37, 53), (1, 1), (3, 64)], ids=str)
def test_color_jitter_and_grayscale_ops_equal_torchvision(name, size, rng):
    """ColorJitter's four adjustments (hue: the float32 HSV round trip) and RandomGrayscale, by factor."""
    factors = {"adjust_hue": [-0.5, -0.23, 0.0, 0.1, 0.5, 0.377]}.get(name, [0.0, 0.37, 1.0, 1.8, 0.6123])
    for f in factors:
        f = float(np.float32(f))  # factors are float32 draws, as torch's uniform_ makes them
        img = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
        img[: size[0] // 2, : size[1] // 3] = img[: size[0] // 2, : size[1] // 3, :1]  # grey pixels: maxc == minc
        want = FACTOR_FNS[name](torch.from_numpy(img).permute(2, 0, 1), f).permute(1, 2, 0).numpy()
        for emulate in (False, True):
            ours = _C._augment_apply(img, OPS.index(FACTOR_OP[name]), f, [0, 0, 0], emulate_fma=emulate,
                                     by_factor=True)
            if FACTOR_OP[name] in BLENDS + ("Grayscale",):
                assert_blend_equal(ours, want, (name, f, emulate))
            else:
                assert np.array_equal(ours, want), (name, f, emulate, int((ours != want).sum()))


def test_flat_and_single_value_images():
    """AutoContrast and Equalize leave a one-value image as torchvision does (no division by zero)."""
    for v in (0, 77, 255):
        img = np.full((9, 11, 3), v, dtype=np.uint8)
        for name in ("AutoContrast", "Equalize", "Contrast", "Sharpness"):
            want = torchvision_op(torch.from_numpy(img).permute(2, 0, 1), name, 0.5).permute(1, 2, 0).numpy()
            assert np.array_equal(_C._augment_apply(img, OPS.index(name), 0.5, [0, 0, 0]), want), (name, v)


@pytest.fixture
def root(tmp_path, rng):
    return jpeg_root(tmp_path, rng)


@pytest.mark.parametrize("augment", [
    TrivialAugmentWide(), RandAugment(num_ops=3, magnitude=13), AutoAugment("imagenet"),
    AutoAugment("svhn", fill=[9, 200, 31]), TrivialAugmentWide(num_magnitude_bins=7, fill=100),
], ids=["ta", "ra3", "aa-imagenet", "aa-svhn-fill", "ta7-fill"])
def test_each_output_is_torchvision_ops_on_the_resized_image(root, augment):
    """The augmented output, normalised and erased, is torchvision's ops (with the draws the Loader
    reports) on the un-augmented uint8 output, then ToDtype + Normalize + erase."""
    ds = fastpipe.ImageFolder(root, cache_dir="off")
    size = untailed(32, 23)
    plain = outputs(ds, RandomResizedCrop(size, scale=(0.3, 1.0), out_dtype=torch.uint8))
    t = RandomResizedCrop(size, scale=(0.3, 1.0), mean=MEAN, std=STD, augment=augment,
                          erase=RandomErasing(0.3, value=(0.5, -1.0, 2.0)))
    got = outputs(ds, t)
    applied = set()
    for epoch, (a, b) in enumerate(zip(plain, got, strict=True)):
        for i, (ops, box) in enumerate(zip(t.augmented(range(len(ds)), epoch, seed=4),
                                           t.erased(range(len(ds)), epoch, seed=4), strict=True)):
            img = a[i]
            for name, m in ops:
                img = torchvision_op(img, name, m, None if augment.fill == [0, 0, 0] else [float(v) for v in augment.fill])
                applied.add(name)
            want = F2.normalize(F2.to_dtype(img, torch.float32, scale=True), MEAN, STD)
            if box[2]:
                want = F2.erase(want, *box, torch.tensor([0.5, -1.0, 2.0]).view(3, 1, 1))
            torch.testing.assert_close(b[i], want, rtol=0, atol=2e-6, msg=f"{epoch} {i} {ops}")
    assert len(applied) >= 4, applied


SIMCLR = [RandomApply([ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), RandomGrayscale(0.2)]


@pytest.mark.parametrize("augment", [
    SIMCLR, ColorJitter(brightness=(0.2, 0.9), hue=0.5), [TrivialAugmentWide(), RandomGrayscale(0.5)],
    [RandomApply([ColorJitter(0.8, 0.8, 0.8, 0.2), RandomGrayscale(0.5)], p=0.6), RandAugment(1, 20)],
], ids=["simclr", "jitter", "ta-grey", "apply-two"])
def test_each_output_is_torchvisions_jitter_and_grayscale_on_the_resized_image(root, augment):
    ds = fastpipe.ImageFolder(root, cache_dir="off")
    size = untailed(26, 32)
    plain = outputs(ds, CenterCrop(size, resize=36, out_dtype=torch.uint8, mirror=0.5), epochs=3)
    t = CenterCrop(size, resize=36, out_dtype=torch.uint8, mirror=0.5, augment=augment)
    got = outputs(ds, t, epochs=3)
    seen = set()
    for epoch, (a, b) in enumerate(zip(plain, got, strict=True)):
        for i, ops in enumerate(t.augmented(range(len(ds)), epoch, seed=4)):
            assert torch.equal(b[i], apply_ops(a[i], ops)), (epoch, i, ops)
            seen |= {name for name, _ in ops}
    assert len(seen) >= 2, seen


@pytest.mark.parametrize("device", [False, True], ids=["cpu", "simulated-device"])
def test_the_simclr_recipe_with_its_blur_on_the_cpu_and_the_device(root, device):
    """SimCLR's augmentations (RandomApply(ColorJitter), RandomGrayscale, GaussianBlur) on the reader threads
    and on the device's per-pixel code: torchvision's ops on the same resized image, exactly but for the
    blur's last-place rounding."""
    ds = fastpipe.ImageFolder(root, cache_dir="off")
    common = dict(size=untailed(26, 32), scale=(0.3, 1.0), dct_scaling=False, out_dtype=torch.uint8)
    t = RandomResizedCrop(augment=[*SIMCLR, RandomApply(GaussianBlur(5, (0.1, 2.0)), p=0.5)], **common)
    run = (lambda tr: device_outputs(ds, tr)[0]) if device else (lambda tr: outputs(ds, tr))
    plain, got = run(RandomResizedCrop(**common)), run(t)
    blurred = 0
    for epoch, (a, b) in enumerate(zip(plain, got, strict=True)):
        for i, ops in enumerate(t.augmented(range(len(ds)), epoch, seed=4)):
            want = apply_ops(a[i], ops, blur=(5, 5))
            if any(name == "gaussian_blur" for name, _ in ops):
                blurred += 1
                worst, share = blur_levels(b[i], want)
                assert worst <= 1 and share < 0.02, (epoch, i, ops, worst, share)
            else:
                assert torch.equal(b[i], want), (epoch, i, ops)
    assert blurred >= 2


def test_jitter_draws_follow_torchvisions_sampling():
    """Each adjustment's factor (uniform over its range) and its place in the order, RandomApply's and
    RandomGrayscale's probabilities, against torchvision's own make_params and probabilities."""
    n = 6000
    mine = RandomResizedCrop(32, augment=SIMCLR).augmented(range(n), epoch=2, seed=9)
    names = ["adjust_brightness", "adjust_contrast", "adjust_saturation", "adjust_hue"]
    jittered = [ops for ops in mine if any(name == "adjust_hue" for name, _ in ops)]
    assert abs(len(jittered) / n - 0.8) < 5 * math.sqrt(0.16 / n)
    grey = sum(any(name == "rgb_to_grayscale" for name, _ in ops) for ops in mine) / n
    assert abs(grey - 0.2) < 5 * math.sqrt(0.16 / n)
    torch.manual_seed(0)
    tv_jitter = T2.ColorJitter(0.4, 0.4, 0.4, 0.1)
    theirs = []
    for _ in range(len(jittered)):
        params = tv_jitter.make_params([torch.zeros(3, 4, 4, dtype=torch.uint8)])
        factors = [params["brightness_factor"], params["contrast_factor"], params["saturation_factor"],
                   params["hue_factor"]]
        theirs.append([(names[int(k)], factors[int(k)]) for k in params["fn_idx"]])
    for name in names:
        a = np.array([m for ops in jittered for op, m in ops if op == name])
        b = np.array([m for ops in theirs for op, m in ops if op == name])
        assert len(a) == len(b) == len(jittered)
        assert means_agree(a, b) and abs(a.min() - b.min()) < 0.01 and abs(a.max() - b.max()) < 0.01, name
        first_a = np.mean([ops[0][0] == name for ops in jittered])
        first_b = np.mean([ops[0][0] == name for ops in theirs])
        assert abs(first_a - first_b) < 5 * math.sqrt(0.1875 / len(jittered)) * math.sqrt(2), (name, first_a, first_b)


def test_uint8_and_nhwc_outputs_keep_the_augmented_pixels(root):
    ds = fastpipe.ImageFolder(root, cache_dir="off")
    size = untailed(31, 32)
    t = CenterCrop(size, resize=36, out_dtype=torch.uint8, mirror=0.5, augment=RandAugment(2, 20))
    nhwc = CenterCrop(size, resize=36, out_dtype=torch.uint8, mirror=0.5, augment=RandAugment(2, 20), layout="NHWC")
    plain = outputs(ds, CenterCrop(size, resize=36, out_dtype=torch.uint8, mirror=0.5), epochs=1)[0]
    got, got_nhwc = outputs(ds, t, epochs=1)[0], outputs(ds, nhwc, epochs=1)[0]
    assert torch.equal(got, got_nhwc)
    for i, ops in enumerate(t.augmented(range(len(ds)), 0, seed=4)):
        img = plain[i]
        for name, m in ops:
            img = torchvision_op(img, name, m)
        assert torch.equal(got[i], img), (i, ops)


def recorded_draws(transform, n, size):
    """torchvision's own choices over n calls: [[(op, magnitude)]], recorded where it applies them."""
    seen = []
    original = type(transform)._apply_image_or_video_transform

    def record(self, image, transform_id, magnitude, **kw):
        seen[-1].append((transform_id, magnitude))
        return image

    type(transform)._apply_image_or_video_transform = record
    try:
        torch.manual_seed(0)
        img = torch.zeros(3, *size, dtype=torch.uint8)
        for _ in range(n):
            seen.append([])
            transform(img)
    finally:
        type(transform)._apply_image_or_video_transform = original
    return seen


def op_facts(draws):
    """Per op: its share of the ops and its magnitudes; the share of samples with k ops."""
    flat = [d for sample in draws for d in sample]
    facts = {name: (sum(op == name for op, _ in flat) / len(flat), np.array([v for op, v in flat if op == name]))
             for name in OPS}
    return facts, np.bincount([len(s) for s in draws], minlength=9) / len(draws)


def means_agree(a, b):
    """Means of two samples within 5 standard errors of their difference."""
    if len(a) == 0 or len(b) == 0:
        return len(a) == len(b)
    se = math.sqrt(a.var() / len(a) + b.var() / len(b)) + 1e-9
    return abs(a.mean() - b.mean()) < 5 * se


@pytest.mark.parametrize("ours,theirs", [
    (TrivialAugmentWide(), T2.TrivialAugmentWide()),
    (RandAugment(num_ops=2, magnitude=9), T2.RandAugment(num_ops=2, magnitude=9)),
    (AutoAugment("imagenet"), T2.AutoAugment(T2.AutoAugmentPolicy.IMAGENET)),
    (AutoAugment("cifar10"), T2.AutoAugment(T2.AutoAugmentPolicy.CIFAR10)),
], ids=["ta", "ra", "aa-imagenet", "aa-cifar10"])
def test_the_draws_follow_torchvisions_sampling(ours, theirs):
    n, size = 6000, (40, 56)
    t = RandomResizedCrop(size, augment=ours)
    mine = [[(name, m) for name, m in ops] for ops in t.augmented(range(n), epoch=5, seed=3)]
    (f_ours, count_ours), (f_theirs, count_theirs) = op_facts(mine), op_facts(recorded_draws(theirs, n, size))
    assert np.abs(count_ours - count_theirs).max() < 0.03, (count_ours, count_theirs)
    total = sum(len(s) for s in mine)
    for name in OPS:
        (share_o, m_o), (share_t, m_t) = f_ours[name], f_theirs[name]
        sd = math.sqrt(max(share_t, 1e-3) * (1 - share_t) / total) * math.sqrt(2)
        assert abs(share_o - share_t) < 5 * sd, (name, share_o, share_t)
        assert means_agree(m_o, m_t) and means_agree(np.abs(m_o), np.abs(m_t)), (name, m_o.mean(), m_t.mean())
    # Every magnitude drawn is one of torchvision's table values.
    table = {round(float(v), 6) for ops in recorded_draws(theirs, 2000, size) for _, v in ops}
    assert {round(float(v), 6) for ops in mine for _, v in ops} <= table | {-v for v in table}


def test_draws_are_a_function_of_seed_epoch_and_sample(root, rng):
    """A sample's augmented output depends on (seed, epoch, sample) only: not on the batch it lands in,
    the order, the reader threads or the pass; and the report agrees (a sample alone, or among others)."""
    ds = fastpipe.ImageFolder(root, cache_dir="off")
    t = RandomResizedCrop(untailed(16, 16), out_dtype=torch.uint8, augment=TrivialAugmentWide())
    plain = outputs(ds, t, seed=1, epochs=2)  # batches of 3 in sample order, one reader thread's choice
    order = [int(i) for i in rng.permutation(len(ds))]
    ld = fastpipe.Loader(ds, batch_size=4, sampler=order, transforms={0: t}, seed=1, num_threads=2, timeout=60)
    for epoch in range(2):
        ld.set_epoch(epoch)
        shuffled = torch.cat([x for x, _ in ld])
        assert torch.equal(shuffled[np.argsort(order)], plain[epoch]), epoch
    assert not torch.equal(plain[0], plain[1])  # another epoch, other draws
    assert not torch.equal(outputs(ds, t, seed=2, epochs=1)[0], plain[0])  # another seed too
    assert t.augmented([7], 3, seed=1) == [t.augmented(range(10), 3, seed=1)[7]]
    assert t.augmented(range(40), 0, seed=1) != t.augmented(range(40), 0, seed=2)
    assert RandomResizedCrop(32).augmented(range(5), 0) == [[]] * 5


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="'nearest'.*'bilinear' or 'bicubic'"):
        TrivialAugmentWide(interpolation="lanczos")
    with pytest.raises(ValueError, match="num_ops"):
        RandAugment(num_ops=17)
    with pytest.raises(ValueError, match="magnitude"):
        RandAugment(magnitude=31)
    with pytest.raises(ValueError, match="policy"):
        AutoAugment("coco")
    with pytest.raises(ValueError, match="fill"):
        TrivialAugmentWide(fill=(1, 2))
    with pytest.raises(ValueError, match="fill"):
        TrivialAugmentWide(fill=300)
    with pytest.raises(ValueError, match="512 magnitudes"):
        RandomResizedCrop(32, augment=TrivialAugmentWide(num_magnitude_bins=60))
    with pytest.raises(TypeError, match="augment must be"):
        RandomResizedCrop(32, augment=T2.TrivialAugmentWide())
    with pytest.raises(ValueError, match="odd"):
        GaussianBlur(4)
    with pytest.raises(ValueError, match="kernel_size"):
        GaussianBlur(49)
    with pytest.raises(ValueError, match="reflect padding"):
        RandomResizedCrop(8, augment=GaussianBlur(17))
    with pytest.raises(ValueError, match="at most one GaussianBlur"):
        RandomResizedCrop(32, augment=[GaussianBlur(3), GaussianBlur(5)])
    with pytest.raises(ValueError, match="hue"):
        ColorJitter(hue=0.7)
    with pytest.raises(ValueError, match="fills differ"):
        RandomResizedCrop(32, augment=[TrivialAugmentWide(fill=1), RandAugment(fill=2)])
    with pytest.raises(ValueError, match="or their interpolations"):
        RandomResizedCrop(32, augment=[TrivialAugmentWide(), RandomApply(RandAugment(interpolation="bilinear"))])
    with pytest.raises(ValueError, match="at most 16 ops a sample in all, these stages draw up to 18"):
        RandomResizedCrop(32, augment=[RandAugment(num_ops=12), ColorJitter(0.1, 0.1, 0.1, 0.1), AutoAugment()])
    with pytest.raises(TypeError, match="RandomApply takes"):
        RandomApply([RandomApply(ColorJitter(0.1))])


@pytest.mark.parametrize("T", [T1, T2], ids=["v1", "v2"])
def test_torchvision_reference_train_pipeline_switches_in_one_line(root, T):
    """torchvision's classification reference recipe as presets.ClassificationPresetTrain builds it with
    auto_augment_policy="ta_wide" and random_erase_prob (its interpolation, bilinear, passed to
    TrivialAugmentWide too): RRC, flip, TrivialAugmentWide, PILToTensor, ToDtype, Normalize,
    RandomErasing, handed to fastpipe.Loader with its ImageFolder."""
    to_float = [T.PILToTensor(), (T.ConvertImageDtype(torch.float) if T is T1 else T.ToDtype(torch.float, scale=True))]
    bilinear = T.InterpolationMode.BILINEAR
    pipeline = T.Compose([T.RandomResizedCrop(24, interpolation=bilinear, antialias=True), T.RandomHorizontalFlip(0.5),
                          T.TrivialAugmentWide(interpolation=bilinear), *to_float, T.Normalize(MEAN, STD),
                          T.RandomErasing(p=0.1)])
    ds = tv.datasets.ImageFolder(root, transform=pipeline)
    got = torch.cat([x for x, _ in fastpipe.Loader(ds, batch_size=3, seed=4)])
    reference = RandomResizedCrop(24, mirror=0.5, mean=MEAN, std=STD,
                                  augment=TrivialAugmentWide(interpolation="bilinear"), erase=RandomErasing(p=0.1))
    want = torch.cat([x for x, _ in fastpipe.Loader(fastpipe.ImageFolder(root, cache_dir="off"), batch_size=3,
                                                    seed=4, transforms={0: reference})])
    assert torch.equal(got, want)
    # The other two, with their arguments.
    for step, ours in ((T.RandAugment(num_ops=3, magnitude=5, fill=[1, 2, 3]), RandAugment(3, 5, fill=[1, 2, 3])),
                       (T.AutoAugment(T.AutoAugmentPolicy.CIFAR10), AutoAugment("cifar10"))):
        p = T.Compose([T.CenterCrop(20), step, T.PILToTensor()])
        got = torch.cat([x for x, _ in fastpipe.Loader(tv.datasets.ImageFolder(root, transform=p), batch_size=3,
                                                       seed=2)])
        fused = CenterCrop(20, out_dtype=torch.uint8, augment=ours)
        want = torch.cat([x for x, _ in fastpipe.Loader(fastpipe.ImageFolder(root, cache_dir="off"), batch_size=3,
                                                        seed=2, transforms={0: fused})])
        assert torch.equal(got, want)
    simclr = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(),
                        T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), T.RandomGrayscale(p=0.2),
                        T.RandomApply([T.GaussianBlur(5)], p=0.5), T.PILToTensor()])
    got = torch.cat([x for x, _ in fastpipe.Loader(tv.datasets.ImageFolder(root, transform=simclr), batch_size=3,
                                                   seed=5)])
    fused = RandomResizedCrop(24, out_dtype=torch.uint8, mirror=0.5,
                              augment=[*SIMCLR, RandomApply(GaussianBlur(5, (0.1, 2.0)), p=0.5)])
    want = torch.cat([x for x, _ in fastpipe.Loader(fastpipe.ImageFolder(root, cache_dir="off"), batch_size=3,
                                                    seed=5, transforms={0: fused})])
    assert torch.equal(got, want)
    # The reference recipe on the simulated device: its readers hand the JPEGs over and the device decodes
    # and augments them, as it does for the fastpipe form.
    def on_device(dataset):
        with _device.simulated(max_delay_us=100, seed=3) as sim:
            ld = fastpipe.Loader(dataset, batch_size=3, seed=4, device="cuda", image_decode="device",
                                 transforms=None if dataset is tv_ds else {0: reference})
            out = []
            for x, _ in ld:
                sim.synchronize(sim.consumer_stream())
                out.append(x.cpu())
            assert ld.stats()["images_decoded_on_device"] > 0
            del ld
            sim.drain()
        return torch.cat(out)

    tv_ds = tv.datasets.ImageFolder(root, transform=pipeline)
    assert torch.equal(on_device(tv_ds), on_device(fastpipe.ImageFolder(root, cache_dir="off")))
    refused = ((T.TrivialAugmentWide(interpolation=T.InterpolationMode.LANCZOS), "'nearest'.*'bilinear' or 'bicubic'"),
               (T.RandomApply([T.RandomRotation(10)], p=0.5), "RandomApply is fused around the augmentations"))
    for bad, match in refused:
        with pytest.raises(ValueError, match=match):
            fastpipe.Loader(tv.datasets.ImageFolder(root, transform=T.Compose([T.RandomResizedCrop(24), bad,
                                                                               T.PILToTensor()])), batch_size=2)
    flip_after = T.Compose([T.RandomResizedCrop(24), T.TrivialAugmentWide(), T.RandomHorizontalFlip(), T.PILToTensor()])
    with pytest.raises(ValueError, match="RandomHorizontalFlip"):
        fastpipe.Loader(tv.datasets.ImageFolder(root, transform=flip_after), batch_size=2)
    after_float = T.Compose([T.RandomResizedCrop(24), *to_float, T.TrivialAugmentWide()])
    with pytest.raises(ValueError, match="TrivialAugmentWide"):
        fastpipe.Loader(tv.datasets.ImageFolder(root, transform=after_float), batch_size=2)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_on_the_simulated_device_each_output_is_torchvision_ops_on_its_resized_image(root, layout):
    """The device path (the resample into the work areas, then augment_images.h's per-pixel code, as the
    GPU kernel runs it) gives torchvision's ops on the device's own resized uint8 image, and the CPU
    loader's outputs but where the two resamples round a value differently."""
    ds = fastpipe.ImageFolder(root, cache_dir="off")
    common = dict(size=untailed(27, 32), scale=(0.3, 1.0), dct_scaling=False, layout=layout)
    augment = RandAugment(num_ops=3, magnitude=15, fill=[10, 20, 30])
    t = RandomResizedCrop(mean=MEAN, std=STD, augment=augment, erase=RandomErasing(0.3, value=(0.5, -1.0, 2.0)),
                          **common)
    plain, _ = device_outputs(ds, RandomResizedCrop(out_dtype=torch.uint8, **common))
    got, stats = device_outputs(ds, t)
    assert stats["images_decoded_on_device"] >= len(ds)  # the rest shrink more than 4x: the readers decode them
    assert stats["images_decoded_on_device"] + stats["images_decoded_on_host"] == 2 * len(ds)
    for epoch, (a, b) in enumerate(zip(plain, got, strict=True)):
        for i, (ops, box) in enumerate(zip(t.augmented(range(len(ds)), epoch, seed=4),
                                           t.erased(range(len(ds)), epoch, seed=4), strict=True)):
            img = a[i]
            for name, m in ops:
                img = torchvision_op(img, name, m, [10.0, 20.0, 30.0])
            want = F2.normalize(F2.to_dtype(img, torch.float32, scale=True), MEAN, STD)
            if box[2]:
                want = F2.erase(want, *box, torch.tensor([0.5, -1.0, 2.0]).view(3, 1, 1))
            torch.testing.assert_close(b[i], want, rtol=0, atol=2e-6, msg=f"{epoch} {i} {ops}")
    cpu = outputs(ds, t)
    for a, b in zip(cpu, got, strict=True):
        differ = (a != b).float().mean().item()
        assert differ < 0.05, differ  # a resampled value on the other side of a rounding, moved by an op


def test_a_device_loader_augments_the_images_its_readers_decode(root, rng):
    """Records the device is not given (a PNG here) are augmented by the reader threads, in the same batches."""
    from PIL import Image

    Image.fromarray(picture(rng, 50, 70)).save(f"{root}/c0/extra.png")
    ds = fastpipe.ImageFolder(root, cache_dir="off")
    t = CenterCrop(24, resize=30, out_dtype=torch.uint8, augment=TrivialAugmentWide(), dct_scaling=False)
    got, stats = device_outputs(ds, t, epochs=1)
    assert stats["images_decoded_on_host"] == 1 and stats["images_decoded_on_device"] == len(ds) - 1
    plain, _ = device_outputs(ds, CenterCrop(24, resize=30, out_dtype=torch.uint8, dct_scaling=False), epochs=1)
    for i, ops in enumerate(t.augmented(range(len(ds)), 0, seed=4)):
        img = plain[0][i]
        for name, m in ops:
            img = torchvision_op(img, name, m)
        assert torch.equal(got[0][i], img), (i, ops)


@pytest.mark.gpu
def test_on_a_gpu_the_augmentation_kernel_gives_torchvisions_ops(root):
    """The kernel (loader_kernels.cu: augment_images_kernel, one block per image) on the GPU's own resized
    images: torchvision's ops with the draws the Loader reports, exactly."""
    ds = fastpipe.ImageFolder(root, cache_dir="off")
    common = dict(size=(40, 36), scale=(0.3, 1.0), dct_scaling=False)
    t = RandomResizedCrop(mean=MEAN, std=STD, augment=TrivialAugmentWide(), erase=RandomErasing(0.3), **common)
    plain, got = gpu_outputs(ds, RandomResizedCrop(out_dtype=torch.uint8, **common)), gpu_outputs(ds, t)
    for epoch, (a, b) in enumerate(zip(plain, got, strict=True)):
        for i, (ops, box) in enumerate(zip(t.augmented(range(len(ds)), epoch, seed=4),
                                           t.erased(range(len(ds)), epoch, seed=4), strict=True)):
            img = a[i]
            for name, m in ops:
                img = torchvision_op(img, name, m)
            want = F2.normalize(F2.to_dtype(img, torch.float32, scale=True), MEAN, STD)
            if box[2]:
                want = F2.erase(want, *box, torch.zeros(3, 1, 1))
            torch.testing.assert_close(b[i], want, rtol=0, atol=2e-6, msg=f"{epoch} {i} {ops}")


def test_a_model_learns_through_the_reference_recipe(tmp_path, rng):
    """A training smoke test: torchvision's reference recipe (RRC, flip, TrivialAugmentWide, normalise,
    RandomErasing) fused in the Loader feeds a small convnet whose loss falls on two classes of stripes
    (vertical or horizontal, the cue the recipe's ops keep more often than not)."""
    root = tmp_path / "stripes"
    for k in range(48):
        cls = k % 2
        period = int(rng.integers(6, 12))
        wave = (np.arange(64) // (period // 2)) % 2 * 200 + 30
        img = np.broadcast_to(wave[None, :, None] if cls == 0 else wave[:, None, None], (64, 64, 3)).astype(np.uint8)
        img = np.clip(img + rng.integers(-20, 20, img.shape), 0, 255).astype(np.uint8)
        write(str(root / f"c{cls}" / f"{k}.jpg"), jpeg_bytes(img, subsampling=0))
    t = RandomResizedCrop(32, scale=(0.5, 1.0), mean=MEAN, std=STD, augment=TrivialAugmentWide(),
                          erase=RandomErasing(0.1))
    ld = fastpipe.Loader(fastpipe.ImageFolder(str(root), cache_dir="off"), batch_size=8, shuffle=True, seed=1,
                         transforms={0: t})
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 5, stride=2), torch.nn.ReLU(), torch.nn.Conv2d(8, 16, 5, stride=2),
                                torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    per_epoch = []
    for _ in range(12):
        losses = []
        for x, y in ld:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        per_epoch.append(float(np.mean(losses)))
    assert np.mean(per_epoch[-3:]) < 0.75 * np.mean(per_epoch[:2]), per_epoch
