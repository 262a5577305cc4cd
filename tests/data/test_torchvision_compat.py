"""torchvision's ImageFolder handed to fastpipe.Loader as it is (the one-line switch): the same files and
labels, its transform pipeline fused, checked against torchvision's own DataLoader output."""

import pytest
import torch

import fastpipe
from fastpipe.data import torchvision_compat
from fastpipe.transforms import CenterCrop, RandomResizedCrop

from jpegs import EXACT_TOL, assert_on_boxes, make_tree, reference_center_crop

tv = pytest.importorskip("torchvision")
T1 = tv.transforms
T2 = pytest.importorskip("torchvision.transforms.v2")
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
pytestmark = [pytest.mark.timeout(120, method="thread"), pytest.mark.torch_build]


@pytest.fixture
def root(tmp_path, rng):
    r = tmp_path / "tree"
    make_tree(str(r), rng, [(75, 100), (100, 75), (61, 89), (40, 40), (90, 30)])
    return str(r)


def test_eval_pipeline_matches_torchvision_dataloader(root):
    for T in (T1, T2):
        to_float = [T1.ToTensor()] if T is T1 else [T2.ToImage(), T2.ToDtype(torch.float32, scale=True)]
        ds = tv.datasets.ImageFolder(root, transform=T.Compose([T.Resize(48), T.CenterCrop(40), *to_float,
                                                                T.Normalize(MEAN, STD)]))
        loader = fastpipe.Loader(ds, batch_size=2)
        assert loader.dataset is ds, "the dataset given, as DataLoader's"
        ours = list(loader)
        theirs = list(torch.utils.data.DataLoader(ds, batch_size=2))
        assert len(ours) == len(theirs)
        std = torch.tensor(STD).view(1, 3, 1, 1) * 255
        for (x, y), (rx, ry) in zip(ours, theirs, strict=True):
            assert torch.equal(y, ry)
            assert x.shape == rx.shape and x.dtype == rx.dtype
            assert float(((x - rx) * std).abs().max()) <= EXACT_TOL  # in levels of 255


def test_a_resize_to_height_and_width_alone_matches_torchvision(root):
    """Resize((h, w)) makes every image that size (tutorials' fine-tuning pipelines): no crop needed. The
    fixture's images shrink less than 2x on some side, so the fused path is the exact one."""
    for T in (T1, T2):
        to_tensor = [T1.ToTensor()] if T is T1 else [T2.ToImage(), T2.ToDtype(torch.float32, scale=True)]
        ds = tv.datasets.ImageFolder(root, transform=T.Compose([T.Resize((48, 56)), T.RandomHorizontalFlip(0.0),
                                                                *to_tensor]))
        ours = torch.cat([x for x, _ in fastpipe.Loader(ds, batch_size=2)])
        theirs = torch.cat([x for x, _ in torch.utils.data.DataLoader(ds, batch_size=2)])
        assert ours.shape == theirs.shape == (5, 3, 48, 56)
        assert float((ours - theirs).abs().max()) * 255 <= EXACT_TOL


def test_train_pipeline_becomes_the_fused_transform(root):
    pipeline = T2.Compose([T2.RandomResizedCrop(32, scale=(0.3, 1.0)), T2.RandomHorizontalFlip(0.25),
                           T2.ToImage(), T2.ToDtype(torch.bfloat16, scale=True), T2.Normalize(MEAN, STD)])
    got = [(x.float(), y) for x, y in fastpipe.Loader(tv.datasets.ImageFolder(root, transform=pipeline),
                                                      batch_size=2, seed=3, shuffle=True)]
    fused = RandomResizedCrop(32, scale=(0.3, 1.0), mirror=0.25, out_dtype=torch.bfloat16, mean=MEAN, std=STD)
    want = [(x.float(), y) for x, y in fastpipe.Loader(fastpipe.ImageFolder(root, transform=fused), batch_size=2,
                                                       seed=3, shuffle=True)]
    for (a, la), (b, lb) in zip(got, want, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
    x, _ = next(iter(fastpipe.Loader(tv.datasets.ImageFolder(root, transform=T1.Compose(
        [T1.CenterCrop(20), T1.PILToTensor()])), batch_size=5)))
    assert x.dtype == torch.uint8 and x.shape == (5, 3, 20, 20)
    ref = next(iter(fastpipe.Loader(fastpipe.ImageFolder(root, transform=CenterCrop(20, out_dtype=torch.uint8)),
                                    batch_size=5)))[0]
    assert torch.equal(x, ref)


@pytest.mark.parametrize("pipeline,match", [
    (lambda: T2.Compose([T2.RandomResizedCrop(32), T2.RandomRotation(10), T2.ToImage()]), "RandomRotation"),
    (lambda: T1.Compose([T1.RandomResizedCrop(32, interpolation=T1.InterpolationMode.LANCZOS), T1.ToTensor()]),
     "interpolation='lanczos'"),
    (lambda: T2.Compose([T2.PILToTensor(), T2.Resize(32, antialias=False), T2.CenterCrop(32)]), "antialias=False"),
    (lambda: T1.Compose([T1.ToTensor(), T1.Normalize(MEAN, STD)]), "make every image the same size"),
    (lambda: T1.Compose([T1.RandomResizedCrop(32)]), "returns PIL images"),
    (lambda: T2.Compose([T2.RandomResizedCrop(32), T2.ToImage(), T2.ToDtype(torch.float32)]), "unscaled float"),
    (lambda: T1.Compose([T1.CenterCrop(8), lambda im: im, T1.ToTensor()]), "not a torchvision transform"),
])
def test_steps_without_a_fused_equivalent_are_named(root, pipeline, match):
    with pytest.raises(ValueError, match=match):
        fastpipe.Loader(tv.datasets.ImageFolder(root, transform=pipeline()), batch_size=2)


def test_resize_then_random_crop_is_fused_and_crops_where_it_says(root):
    """Resize + RandomCrop + RandomHorizontalFlip (older fine-tuning recipes): PIL's resize cropped at the
    places the fused transform reports (its draws are fastpipe's, not torch's generator's)."""
    steps = [T1.Resize(48), T1.RandomCrop(40), T1.RandomHorizontalFlip(), T1.ToTensor()]
    ds = tv.datasets.ImageFolder(root, transform=T1.Compose(steps))
    fused = torchvision_compat.convert_transform(ds.transform)
    assert isinstance(fused, fastpipe.transforms.RandomCrop) and fused.resize == 48 and fused.mirror == 0.5
    got = torch.cat([x for x, _ in fastpipe.Loader(ds, batch_size=2, seed=3)])
    assert_on_boxes(ds.samples, got, fused.boxes(fastpipe.ImageFolder(root), range(len(ds)), 0, seed=3),
                    lambda im, box: reference_center_crop(im, (40, 40), 48, at=box[:2], flip=box[4]))


def test_a_custom_loader_is_refused(root):
    t = T1.Compose([T1.CenterCrop(8), T1.ToTensor()])
    with pytest.raises(ValueError, match="custom loader"):
        fastpipe.Loader(tv.datasets.ImageFolder(root, transform=t, loader=lambda p: p), batch_size=2)


def test_target_transform_maps_each_label_as_torchvision_does(root):
    """Each label mapped and collated as DataLoader collates the results (ints, one-hot tensors stacked); a
    collate_fn gets the mapped samples; the dataset's own items are mapped too."""
    t = T1.Compose([T1.Resize(48), T1.CenterCrop(40), T1.ToTensor()])
    for target in (lambda y: 10 * y + 3, lambda y: torch.nn.functional.one_hot(torch.tensor(y), 4).float()):
        ds = tv.datasets.ImageFolder(root, transform=t, target_transform=target)
        ours = list(fastpipe.Loader(ds, batch_size=2))
        theirs = list(torch.utils.data.DataLoader(ds, batch_size=2))
        for (x, y), (rx, ry) in zip(ours, theirs, strict=True):
            assert y.dtype == ry.dtype and torch.equal(y, ry)
            assert float((x - rx).abs().max()) * 255 <= EXACT_TOL
    ds = tv.datasets.ImageFolder(root, transform=t, target_transform=lambda y: y + 100)
    got = list(fastpipe.Loader(ds, batch_size=3, collate_fn=lambda samples: [y for _, y in samples]))
    assert sum(got, []) == [y + 100 for y in ds.targets]
    own = fastpipe.ImageFolder(root, transform=fastpipe.transforms.CenterCrop(8), target_transform=lambda y: -y)
    assert [own[i][1] for i in range(len(own))] == [-y for y in ds.targets]
    with pytest.raises(TypeError, match="target_transform must be callable, got int"):
        fastpipe.ImageFolder(root, target_transform=3)


@pytest.mark.parametrize("which", ["MixUp", "CutMix"])
def test_mixup_and_cutmix_take_fastpipe_batches(root, which):
    """Batch-level augmentations stay torchvision's: v2.MixUp and v2.CutMix on a fastpipe batch mix each
    image with the previous one of the batch (torchvision's pairing: the batch rolled by one) and give
    each label the share of the image it came from."""
    ds = fastpipe.ImageFolder(root, transform=CenterCrop(24, mean=MEAN, std=STD))
    x, y = next(iter(fastpipe.Loader(ds, batch_size=5, shuffle=True, seed=3)))
    classes = len(ds.classes)
    torch.manual_seed(0)
    mixed, soft = getattr(T2, which)(num_classes=classes, alpha=1.0)(x, y)
    assert mixed.shape == x.shape and soft.shape == (5, classes)
    other, other_y = x.roll(1, 0), y.roll(1, 0)
    if which == "MixUp":  # every pixel lam of its own image
        share = float(((mixed - other) / (x - other))[(x - other).abs() > 0.1].median())
        torch.testing.assert_close(mixed, share * x + (1 - share) * other, atol=1e-4, rtol=0)
        shares = torch.full((5,), share)
    else:  # one box pasted from the other image, the rest left exactly as it was
        own = (mixed == x).all(dim=1)
        assert torch.equal(own, own[:1].expand_as(own)) and not own.all()
        assert torch.equal(mixed[:, :, ~own[0]], other[:, :, ~own[0]])
        shares = own.float().mean(dim=(1, 2))
    want = shares[:, None] * torch.nn.functional.one_hot(y, classes) + \
        (1 - shares[:, None]) * torch.nn.functional.one_hot(other_y, classes)
    torch.testing.assert_close(soft, want, atol=1e-4, rtol=0)
