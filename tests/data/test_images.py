"""JPEG datasets (ImageFolder, ImageDataset, write_images) and their transforms (RandomResizedCrop,
CenterCrop), checked against Pillow's decode, crop and resize: the PIL path of torchvision, whose
RandomResizedCrop, Resize and CenterCrop call exactly these on PIL images.

Tolerance: with ``dct_scaling=False`` every output value is within one level (of 255) of Pillow's, which
rounds to uint8 between its resize passes (we keep float32); the mean difference is about a quarter of a
level. DCT scaling (decoding large crops at 1/2, 1/4, 1/8) is checked with a looser, stated bound.
"""

import json
import os
import shutil
import warnings

import numpy as np
import pytest
import torch

import fastpipe
from fastpipe.data import _device
from fastpipe.transforms import CenterCrop, RandomCrop, RandomResizedCrop

from image_files import pil_rgb_array, pillow_bytes
from jpegs import (EXACT_TOL, as_hwc_255, assert_on_boxes, jpeg_bytes, make_tree, picture, pil_rgb,
                   reference_center_crop, reference_resized_crop, write)

pytestmark = pytest.mark.timeout(180, method="thread")
IMAGENET = dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
# Awkward sizes: odd, prime, tall, wide, tiny, and one that is cropped on iMCU boundaries only by luck.
SIZES = [(375, 500), (500, 375), (97, 131), (64, 64), (33, 301), (1, 1), (240, 17), (257, 263)]


@pytest.fixture
def tree(tmp_path, rng):
    root = tmp_path / "tree"
    paths = make_tree(str(root), rng, SIZES)
    return root, paths


@pytest.fixture
def folder(tree, tmp_path):
    root, _ = tree
    return fastpipe.ImageFolder(str(root), cache_dir=str(tmp_path / "cache"))


def batches(loader):
    """Every (images, labels) of one pass, as numpy copies."""
    return [(x.float().numpy().copy() if x.dtype == torch.bfloat16 else x.numpy().copy(), y.numpy().copy())
            for x, y in loader]


def loader(ds, transform, **kw):
    return fastpipe.Loader(ds, **{"batch_size": 3, "transforms": {0: transform}, "timeout": 60, **kw})


# ---- ImageFolder: files, order, labels, index --------------------------------------------------------

def test_imagefolder_lists_files_classes_and_labels_as_torchvision(tree, folder):
    root, paths = tree
    assert folder.classes == ["a_class", "b_class"]
    expected = sorted(paths, key=lambda p: (os.path.relpath(p, root).split(os.sep)[0], os.path.dirname(p), p))
    assert [p for p, _ in folder.samples] == expected
    assert folder.targets == [folder.class_to_idx[os.path.relpath(p, root).split(os.sep)[0]] for p in expected]
    assert len(folder) == len(SIZES)
    tv = pytest.importorskip("torchvision")
    ref = tv.datasets.ImageFolder(str(root))
    assert ref.classes == folder.classes and ref.samples == folder.samples


def test_image_sizes_come_from_the_headers(folder):
    for (path, _), (h, w) in zip(folder.samples, folder.image_sizes, strict=True):
        assert pil_rgb(path).size == (w, h)


def test_the_index_is_cached_and_rescanned_when_the_tree_changes(tree, tmp_path, rng):
    root, _ = tree
    cache = str(tmp_path / "cache")
    first = fastpipe.ImageFolder(str(root), cache_dir=cache)
    again = fastpipe.ImageFolder(str(root), cache_dir=cache)
    assert first.rescanned and not again.rescanned
    assert again.samples == first.samples and (again.image_sizes == first.image_sizes).all()
    write(str(root / "a_class" / "nested" / "new.jpg"), jpeg_bytes(picture(rng, 20, 30)))
    changed = fastpipe.ImageFolder(str(root), cache_dir=cache)
    assert changed.rescanned and len(changed) == len(first) + 1
    assert fastpipe.ImageFolder(str(root), cache_dir=cache, rescan=True).rescanned
    off = fastpipe.ImageFolder(str(root), cache_dir="off")
    assert off.rescanned and off.samples == changed.samples


def test_full_decode_matches_pillow_for_every_kind_of_jpeg(tmp_path, rng):
    pic = picture(rng, 61, 83)
    kinds = {
        "baseline_420": jpeg_bytes(pic),
        "progressive": jpeg_bytes(pic, progressive=True),
        "subsampling_444": jpeg_bytes(pic, subsampling=0),
        "subsampling_422": jpeg_bytes(pic, subsampling=1),
        "grayscale": jpeg_bytes(pic, mode="L"),
        "cmyk": jpeg_bytes(pic, mode="CMYK"),
        "optimized_low_quality": jpeg_bytes(pic, quality=20, optimize=True),
    }
    for name, data in kinds.items():
        write(str(tmp_path / "t" / "c" / f"{name}.jpg"), data)
    ds = fastpipe.ImageFolder(str(tmp_path / "t"), cache_dir="off")
    for i, (path, _) in enumerate(ds.samples):
        image, label = ds[i]
        ref = np.asarray(pil_rgb(path))
        assert image.dtype == torch.uint8 and image.shape == ref.shape
        np.testing.assert_array_equal(image.numpy(), ref, err_msg=os.path.basename(path))


def test_exif_orientation_is_not_applied_as_in_torchvision(tmp_path, rng):
    pic = picture(rng, 40, 70)
    from PIL import Image
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    path = write(str(tmp_path / "t" / "c" / "rotated.jpg"), jpeg_bytes(pic, exif=exif.tobytes()))
    data = open(path, "rb").read()
    assert fastpipe._ext._C.image_info(data)["orientation"] == 6
    ds = fastpipe.ImageFolder(str(tmp_path / "t"), cache_dir="off")
    assert tuple(ds.image_sizes[0]) == (40, 70)
    np.testing.assert_array_equal(ds[0][0].numpy(), np.asarray(pil_rgb(path)))


# ---- transforms against Pillow ----------------------------------------------------------------------

@pytest.mark.parametrize("size,resize", [(224, 256), ((37, 53), 61), ((64, 48), (70, 90)), (50, None),
                                         (300, None), ((31, 29), 23)])
def test_center_crop_matches_resize_and_center_crop(folder, size, resize):
    t = CenterCrop(size, resize=resize, dct_scaling=False)
    hw = (size, size) if isinstance(size, int) else size
    got = [x for xs, _ in batches(loader(folder, t)) for x in xs]
    for (path, _), x in zip(folder.samples, got, strict=True):
        ref = reference_center_crop(pil_rgb(path), hw, resize)
        ours = as_hwc_255(torch.from_numpy(x))
        diff = np.abs(ours - ref)
        assert diff.max() <= EXACT_TOL, f"{os.path.basename(path)}: max diff {diff.max()} at {np.argmax(diff)}"
        assert diff.mean() <= 0.35


def check_on_boxes(folder, t, seed, reference):
    """Two epochs of transform ``t``: each output within a level of ``reference(PIL image, box)`` at the box
    ``t.boxes()`` reports for it."""
    for epoch in range(2):
        ld = loader(folder, t, seed=seed)
        ld.set_epoch(epoch)
        got = [torch.from_numpy(x) for xs, _ in batches(ld) for x in xs]
        assert_on_boxes(folder.samples, got, t.boxes(folder, range(len(folder)), epoch, seed=seed), reference)


@pytest.mark.parametrize("size", [224, (57, 91)])
def test_random_resized_crop_matches_torchvision_on_its_boxes(folder, size):
    hw = (size, size) if isinstance(size, int) else size
    check_on_boxes(folder, RandomResizedCrop(size, dct_scaling=False), 11,
                   lambda im, box: reference_resized_crop(im, *box[:4], hw, box[4]))


@pytest.mark.parametrize("resize", [None, 150, (90, 200)])
def test_random_crop_matches_torchvision_on_its_places(folder, resize):
    """RandomCrop: the resized image cropped where boxes() says (torchvision's Resize + RandomCrop + flip on
    PIL's pixels), padded as CenterCrop where the crop does not fit."""
    size = (57, 91)

    def reference(im, box):
        top, left, h, w, flip = box
        assert (h, w) == size
        return reference_center_crop(im, size, resize, at=(top, left), flip=flip)

    check_on_boxes(folder, RandomCrop(size, resize=resize, dct_scaling=False), 5, reference)


def test_random_crop_places_are_uniform_and_the_samples_own():
    t = RandomCrop((57, 91), resize=(120, 200))
    n = 4000
    tops, lefts = (np.array(v) for v in zip(*[(b[0], b[1]) for b in t.boxes([(300, 400)] * n, range(n), 0)]))
    for name, v, hi in (("top", tops, 120 - 57), ("left", lefts, 200 - 91)):
        assert v.min() == 0 and v.max() == hi, f"{name} spans [{v.min()}, {v.max()}], not [0, {hi}]"
        share = np.histogram(v, bins=4, range=(0, hi + 1))[0] / n
        assert np.all(np.abs(share - 0.25) < 0.04), f"{name} quarters {share}"
    assert t.boxes([(300, 400)] * 8, [7], 3) == t.boxes([(300, 400)] * 8, [7], 3), "a pure function of the sample"
    other = [b[:2] for b in t.boxes([(300, 400)] * 50, range(50), 1)]
    assert sum(a == b for a, b in zip(other, zip(tops[:50], lefts[:50]))) < 5, "a new epoch draws anew"


def test_dct_scaling_on_large_images_stays_close_to_the_exact_resize(tmp_path, rng):
    # Crops of these are mostly >= 2x the output, so they are decoded at 1/2, 1/4 or 1/8. Photo-like
    # content (features tens of pixels wide, mild grain): on it the two low-passes (the DCT's, then the
    # bilinear filter; or the bilinear filter alone) differ by about a level on average (documented).
    for k, (h, w) in enumerate([(1200, 1600), (2001, 1337), (900, 3000)]):
        write(str(tmp_path / "big" / "c" / f"{k}.jpg"), jpeg_bytes(picture(rng, h, w, grain=3, cells=40),
                                                                     quality=92))
    ds = fastpipe.ImageFolder(str(tmp_path / "big"), cache_dir="off")
    for t in (RandomResizedCrop(160, scale=(0.3, 1.0)), CenterCrop(128, resize=146)):
        denoms = {g[-1] for i, (h, w) in enumerate(ds.image_sizes)
                  for g in [t._image_params(0).geometry(int(h), int(w), 0, i)]}
        assert denoms - {1}, "the test needs crops that are decoded scaled"
        fast = batches(loader(ds, t))[0][0]
        t.dct_scaling = False
        slow = batches(loader(ds, t))[0][0]
        diff = np.abs(fast - slow) * 255
        assert diff.mean() <= 2.0 and np.percentile(diff, 99) <= 16, (diff.mean(), np.percentile(diff, 99))


def test_output_dtypes_layouts_and_normalization_agree(folder):
    base = dict(dct_scaling=False, mirror=0.5)
    plain = batches(loader(folder, RandomResizedCrop(40, **base), seed=5))
    x = np.concatenate([b[0] for b in plain])
    as_u8 = np.concatenate([b[0] for b in batches(loader(folder, RandomResizedCrop(40, out_dtype=torch.uint8,
                                                                                        **base), seed=5))])
    assert as_u8.dtype == np.uint8
    # The same resampled values, rounded (x holds them divided by 255, in float32).
    assert np.abs(as_u8 - x * 255).max() <= 0.5 + 1e-3
    nhwc = np.concatenate([b[0] for b in batches(loader(folder, RandomResizedCrop(40, layout="NHWC", **base),
                                                        seed=5))])
    np.testing.assert_array_equal(nhwc, x.transpose(0, 2, 3, 1))
    norm = np.concatenate([b[0] for b in batches(loader(folder, RandomResizedCrop(40, **IMAGENET, **base),
                                                        seed=5))])
    mean = np.array(IMAGENET["mean"], np.float32)[:, None, None]
    std = np.array(IMAGENET["std"], np.float32)[:, None, None]
    np.testing.assert_allclose(norm, (x - mean) / std, atol=2e-5)
    for dtype in (torch.float16, torch.bfloat16):
        low = np.concatenate([b[0] for b in batches(loader(folder, RandomResizedCrop(40, out_dtype=dtype,
                                                                                     **IMAGENET, **base), seed=5))])
        np.testing.assert_array_equal(low, torch.from_numpy(norm).to(dtype).float().numpy())
    labels = np.concatenate([b[1] for b in plain])
    assert labels.dtype == np.int64 and labels.tolist() == folder.targets


def torchvision_boxes(rng, n, height, width, scale, ratio):
    """torchvision's RandomResizedCrop.get_params, rewritten with numpy's generator: the distribution
    the boxes must follow."""
    out = []
    for _ in range(n):
        for _ in range(10):
            target = height * width * rng.uniform(*scale)
            aspect = np.exp(rng.uniform(np.log(ratio[0]), np.log(ratio[1])))
            w, h = int(round(np.sqrt(target * aspect))), int(round(np.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                out.append((rng.integers(0, height - h + 1), rng.integers(0, width - w + 1), h, w))
                break
        else:
            out.append(None)
    return out


def test_flip_probability_and_box_distribution(folder):
    t = RandomResizedCrop(32, scale=(0.2, 0.9), ratio=(0.5, 2.0), mirror=0.3)
    sizes = [(375, 500)] * 4000
    boxes = t.boxes(sizes, range(4000), epoch=3, seed=9)
    flips = np.mean([b[4] for b in boxes])
    assert abs(flips - 0.3) < 0.03
    h = np.array([b[2] for b in boxes], float)
    w = np.array([b[3] for b in boxes], float)
    top = np.array([b[0] for b in boxes])
    left = np.array([b[1] for b in boxes])
    assert ((top >= 0) & (top + h <= 375) & (left >= 0) & (left + w <= 500)).all()
    area = h * w / (375 * 500)
    # Rounding w and h to integers moves the area and the ratio a little past their ranges.
    assert area.min() >= 0.2 * 0.98 and area.max() <= 0.9 * 1.02
    assert (w / h).min() >= 0.5 * 0.97 and (w / h).max() <= 2.0 * 1.03
    # torchvision's rejection of boxes that do not fit skews the area and ratio: the same moments here.
    ref = [b for b in torchvision_boxes(np.random.default_rng(1), 8000, 375, 500, (0.2, 0.9), (0.5, 2.0)) if b]
    ref_area = np.array([b[2] * b[3] for b in ref]) / (375 * 500)
    ref_logratio = np.log([b[3] / b[2] for b in ref])
    assert abs(area.mean() - ref_area.mean()) < 0.015 and abs(area.std() - ref_area.std()) < 0.015
    assert abs(np.log(w / h).mean() - ref_logratio.mean()) < 0.04
    assert abs(np.log(w / h).std() - ref_logratio.std()) < 0.04
    # The box's place is uniform over the positions where it fits.
    assert abs((top / (375 - h + 1)).mean() - 0.5) < 0.03 and abs((left / (500 - w + 1)).mean() - 0.5) < 0.03
    assert t.boxes(sizes[:5], range(5), 3, seed=9) == boxes[:5]
    assert t.boxes(sizes[:5], range(5), 4, seed=9) != boxes[:5]


def test_impossible_boxes_fall_back_to_torchvision_central_crop():
    t = RandomResizedCrop(16, scale=(0.99, 1.0), ratio=(1.0, 1.0), mirror=0)
    # A 10x1000 strip cannot hold a square of 99% of its area: the fallback is the largest centred
    # crop of ratio within [1, 1], as torchvision computes it.
    assert t.boxes([(10, 1000)], [0], 0) == [(0, 495, 10, 10, False)]
    assert t.boxes([(1, 1)], [0], 0) == [(0, 0, 1, 1, False)]


def test_one_pixel_and_very_large_images(tmp_path, rng):
    write(str(tmp_path / "t" / "c" / "tiny.jpg"), jpeg_bytes(np.full((1, 1, 3), (200, 30, 90), np.uint8)))
    # 10000 x 10000: a flat image with one detail, cheap to encode, decoded at 1/8 for these outputs.
    big = np.full((10000, 10000, 3), 90, np.uint8)
    big[4000:6000, 4000:6000] = (250, 10, 10)
    write(str(tmp_path / "t" / "c" / "huge.jpg"), jpeg_bytes(big, quality=75))
    ds = fastpipe.ImageFolder(str(tmp_path / "t"), cache_dir="off")
    x, y = next(iter(loader(ds, CenterCrop(64, resize=64), batch_size=2)))
    huge, tiny = (0, 1) if ds.samples[0][0].endswith("huge.jpg") else (1, 0)
    np.testing.assert_allclose(x[tiny].numpy() * 255, np.broadcast_to(np.array([200, 30, 90])[:, None, None],
                                                                      (3, 64, 64)), atol=3)
    centre = x[huge, :, 28:36, 28:36].numpy() * 255
    np.testing.assert_allclose(centre, np.broadcast_to(np.array([250, 10, 10])[:, None, None], centre.shape), atol=8)
    assert abs(float(x[huge, 1, 0, 0]) * 255 - 90) < 4


# ---- Loader behaviour ---------------------------------------------------------------------------------

def test_same_batches_for_any_thread_count_and_new_crops_each_epoch(folder):
    t = RandomResizedCrop(24, **IMAGENET)
    one = batches(loader(folder, t, num_threads=1, shuffle=True, seed=2))
    three = batches(loader(folder, t, num_threads=3, shuffle=True, seed=2))
    for (a, la), (b, lb) in zip(one, three, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)
    ld = loader(folder, t, shuffle=False, seed=2)
    e0, e1 = batches(ld), batches(ld)
    assert not np.array_equal(e0[0][0], e1[0][0])
    # Unset num_threads: decoding is CPU-bound, so every core but the training loop's reads (at least 2).
    assert ld.stats()["num_threads"] == max(2, len(os.sched_getaffinity(0)) - 1)


def test_resume_mid_epoch_yields_exactly_the_remaining_batches(folder):
    t = RandomResizedCrop(20, mirror=0.5)
    ld = loader(folder, t, shuffle=True, seed=4, batch_size=2)
    ld.set_epoch(5)
    it = iter(ld)
    next(it)
    state = ld.state_dict()
    rest = [(x.numpy().copy(), y.numpy().copy()) for x, y in it]
    again = loader(folder, t, shuffle=True, seed=4, batch_size=2)
    again.load_state_dict(json.loads(json.dumps(state)))
    resumed = batches(again)
    assert len(resumed) == len(rest) > 0
    for (a, la), (b, lb) in zip(rest, resumed, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)


def test_dataset_transform_and_loader_transforms(tree, tmp_path):
    root, _ = tree
    t = CenterCrop(30, resize=40)
    with_t = fastpipe.ImageFolder(str(root), transform=t, cache_dir=str(tmp_path / "c"))
    a = batches(fastpipe.Loader(with_t, batch_size=4))
    b = batches(loader(fastpipe.ImageFolder(str(root), cache_dir=str(tmp_path / "c")), t, batch_size=4))
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(xa, xb)
    img, label = with_t[1]
    np.testing.assert_array_equal(img.numpy(), a[0][0][1])
    assert label == a[0][1][1]
    with pytest.raises(ValueError, match=r"needs a transform .*\(its images differ: image 0 is \d+x\d+, image \d+ "):
        fastpipe.Loader(fastpipe.ImageFolder(str(root), cache_dir=str(tmp_path / "c")), batch_size=2)


def test_images_of_one_size_are_batched_as_they_are_by_the_transform_the_error_names(tmp_path, rng):
    """Without a transform the Loader refuses, and where every image has one size the error names the
    transform that batches them unchanged: uint8 3xHxW, PIL's pixels of each PNG."""
    h, w = int(rng.integers(5, 40)), int(rng.integers(5, 40))
    arrays = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for _ in range(5)]
    for k, a in enumerate(arrays):
        write(str(tmp_path / "t" / f"c{k % 2}" / f"{k}.png"), pillow_bytes(a, "PNG"))
    ds = fastpipe.ImageFolder(str(tmp_path / "t"), cache_dir="off")
    with pytest.raises(ValueError, match=rf"every image is {h}x{w}: CenterCrop\(\({h}, {w}\), out_dtype=torch.uint8\)"):
        fastpipe.Loader(ds, batch_size=2)
    got = np.concatenate([x.numpy() for x, _ in fastpipe.Loader(ds, batch_size=2, transforms={
        0: CenterCrop((h, w), out_dtype=torch.uint8)})])
    want = np.stack([pil_rgb_array(open(p, "rb").read()) for p, _ in ds.samples]).transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(got, want)


def test_on_the_simulated_device_batches_equal_the_cpu_loader(folder):
    t = RandomResizedCrop(28, out_dtype=torch.bfloat16, **IMAGENET)
    cpu = batches(loader(folder, t, seed=6, shuffle=True))
    with _device.simulated(max_delay_us=200, seed=1) as sim:
        ld = loader(folder, t, seed=6, shuffle=True, device="cuda")
        dev = []
        for x, y in ld:
            sim.synchronize(sim.consumer_stream())
            dev.append((x.float().numpy().copy(), y.numpy().copy()))
        del ld
        sim.drain()
    for (a, la), (b, lb) in zip(cpu, dev, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)


@pytest.mark.gpu
def test_on_a_gpu_batches_equal_the_cpu_loader(folder):
    t = RandomResizedCrop(28, **IMAGENET)
    cpu = batches(loader(folder, t, seed=6))
    gpu = [(x.cpu().numpy(), y.cpu().numpy()) for x, y in loader(folder, t, seed=6, device="cuda")]
    for (a, la), (b, lb) in zip(cpu, gpu, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)


# ---- write_images and ImageDataset -------------------------------------------------------------------

def test_write_images_keeps_the_original_bytes(tree, tmp_path):
    root, _ = tree
    folder = fastpipe.ImageFolder(str(root), cache_dir="off")
    ds = fastpipe.write_images(str(root), str(tmp_path / "packed"), progress=False)
    assert isinstance(ds, fastpipe.ImageDataset) and len(ds) == len(folder)
    blob = open(tmp_path / "packed" / "images.bin", "rb").read()
    offsets = np.load(tmp_path / "packed" / "offsets.npy")
    for i, (path, label) in enumerate(folder.samples):
        assert blob[offsets[i]:offsets[i + 1]] == open(path, "rb").read()
    assert ds.classes == folder.classes and ds.targets == folder.targets
    assert (ds.image_sizes == folder.image_sizes).all()
    assert sorted(os.listdir(tmp_path / "packed")) == ["heights.npy", "images.bin", "labels.npy", "meta.json",
                                                      "offsets.npy", "widths.npy"]
    t = RandomResizedCrop(33, **IMAGENET)
    for (a, la), (b, lb) in zip(batches(loader(folder, t, seed=1, shuffle=True)),
                                batches(loader(ds, t, seed=1, shuffle=True)), strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)


def test_write_images_from_datasets_of_bytes_paths_and_torchvision(tree, tmp_path, rng):
    root, _ = tree
    folder = fastpipe.ImageFolder(str(root), cache_dir="off")
    items = [(open(p, "rb").read() if i % 2 else p, 10 + i) for i, (p, _) in enumerate(folder.samples)]

    class Items:
        classes = [f"k{i}" for i in range(10 + len(items))]

        def __len__(self):
            return len(items)

        def __getitem__(self, i):
            return items[i]

    ds = fastpipe.write_images(Items(), str(tmp_path / "items"), progress=False)
    assert ds.targets == [10 + i for i in range(len(items))] and ds.classes == Items.classes
    np.testing.assert_array_equal(ds[3][0].numpy(), folder[3][0].numpy())
    tv = pytest.importorskip("torchvision")
    ds = fastpipe.write_images(tv.datasets.ImageFolder(str(root)), str(tmp_path / "tv"), progress=False)
    assert ds.targets == folder.targets and ds.classes == folder.classes


def test_write_images_labels_identify_samples_across_shards(tmp_path, rng):
    # Label = index: every rank's batches hold the right image for each label, and the ranks together
    # hold every sample once (shard_remainder="drop" on a divisible count).
    pics = [picture(rng, 20 + k, 30 + 2 * k) for k in range(12)]
    items = [(jpeg_bytes(p), k) for k, p in enumerate(pics)]
    ds = fastpipe.write_images(items, str(tmp_path / "p"), progress=False)
    t = CenterCrop(16, resize=18)
    reference = {k: img.numpy() for k, (img, _) in enumerate(fastpipe.ImageDataset(str(tmp_path / "p"),
                                                                                   transform=t))}
    seen = []
    for rank in range(3):
        for x, y in loader(ds, t, shuffle=True, seed=8, rank=rank, world_size=3, shard_remainder="drop"):
            for img, label in zip(x, y.tolist(), strict=True):
                np.testing.assert_array_equal(img.numpy(), reference[label])
                seen.append(label)
    assert sorted(seen) == list(range(12))


def test_write_images_keeps_what_it_decodes_converts_the_rest_and_lists_what_it_cannot_read(tmp_path, rng):
    from image_files import pil_rgb_array, pillow_bytes
    pic = picture(rng, 21, 34)
    good, png, webp, bmp = (jpeg_bytes(pic), pillow_bytes(pic, "PNG"), pillow_bytes(pic, "WEBP", quality=70),
                            pillow_bytes(pic, "BMP"))
    items = [(good, 0), (png, 1), (webp, 2), (bmp, 3), (b"\xff\xd8garbage", 4), (good[:len(good) // 2], 5)]
    with pytest.warns(UserWarning, match=r"1 converted to PNG .* 2 left out"):
        ds = fastpipe.write_images(items, str(tmp_path / "p"), progress=False)
    assert len(ds) == 4 and ds.targets == [0, 1, 2, 3]
    meta = ds.meta
    assert [c["index"] for c in meta["converted"]] == [3] and "BMP" in meta["converted"][0]["reason"]
    assert [s["index"] for s in meta["skipped"]] == [4, 5]
    assert "truncated" in meta["skipped"][1]["reason"]
    offsets = np.load(tmp_path / "p" / "offsets.npy")
    stored = open(tmp_path / "p" / "images.bin", "rb").read()
    assert [stored[offsets[k]:offsets[k + 1]] for k in range(3)] == [good, png, webp]  # byte for byte
    for k, original in enumerate((good, png, webp, bmp)):
        np.testing.assert_array_equal(ds[k][0].numpy(), pil_rgb_array(original))  # the BMP losslessly


def test_write_images_leaves_nothing_behind_when_the_source_fails(tmp_path, rng):
    good = jpeg_bytes(picture(rng, 19, 23))

    class Failing:
        def __len__(self):
            return 3

        def __getitem__(self, i):
            if i == 2:
                raise RuntimeError("source broke")
            return good, i

    with pytest.raises(RuntimeError, match="source broke"):
        fastpipe.write_images(Failing(), str(tmp_path / "p"), progress=False)
    assert not (tmp_path / "p").exists()
    fastpipe.write_images([(good, 0)], str(tmp_path / "q"), progress=False)
    with pytest.raises(RuntimeError, match="source broke"):
        fastpipe.write_images(Failing(), str(tmp_path / "q"), progress=False)
    assert len(fastpipe.ImageDataset(str(tmp_path / "q"))) == 1  # the earlier dataset is intact
    shutil.rmtree(tmp_path / "q")
