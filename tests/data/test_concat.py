"""A torch ConcatDataset given to the Loader: of image folders, the parts' samples in turn, each with its own
label, against each part read alone and against torchvision's DataLoader; of TensorDatasets, against
DataLoader."""

import numpy as np
import pytest
import torch

import fastpipe
from fastpipe.transforms import CenterCrop, RandomResizedCrop

from jpegs import make_tree


def sizes(rng, n):
    return [(int(h), int(w)) for h, w in rng.integers(20, 60, (n, 2))]


def test_parts_read_in_turn_with_their_labels(tmp_path, rng):
    make_tree(tmp_path / "a", rng, sizes(rng, 7))
    make_tree(tmp_path / "b", rng, sizes(rng, 9), classes=("z", "y", "x"))
    crop = CenterCrop(16, resize=20)
    a = fastpipe.ImageFolder(str(tmp_path / "a"), transform=crop)
    b = fastpipe.ImageFolder(str(tmp_path / "b"), transform=crop)
    picked = [8, 0, 5]
    concat = torch.utils.data.ConcatDataset([a, torch.utils.data.Subset(b, picked), a])
    loader = fastpipe.Loader(concat, batch_size=4, timeout=60)
    assert loader.dataset is concat and len(loader.dataset) == 17, "the dataset given, as DataLoader's"
    batches = list(loader)
    images = torch.cat([x for x, _ in batches])
    labels = torch.cat([y for _, y in batches])
    want = [a[i] for i in range(7)] + [b[i] for i in picked] + [a[i] for i in range(7)]
    assert torch.equal(images, torch.stack([x for x, _ in want]))
    assert labels.tolist() == [y for _, y in want], "each sample keeps its own part's label"
    # shuffled: every sample once, an image with its label
    shuffled = list(fastpipe.Loader(concat, batch_size=5, shuffle=True, seed=3, timeout=60))
    got = sorted((x.flatten().tolist(), int(y)) for xs, ys in shuffled for x, y in zip(xs, ys))
    assert got == sorted((x.flatten().tolist(), y) for x, y in want)


def test_random_draws_follow_the_concatenated_sample(tmp_path, rng):
    make_tree(tmp_path / "a", rng, sizes(rng, 5))
    make_tree(tmp_path / "b", rng, sizes(rng, 6))
    crop = RandomResizedCrop(16)
    parts = [fastpipe.ImageFolder(str(tmp_path / d), transform=crop) for d in "ab"]
    concat = torch.utils.data.ConcatDataset(parts)
    whole = fastpipe.ImageFolder(samples=parts[0].samples + parts[1].samples, transform=crop)
    got = torch.cat([x for x, _ in fastpipe.Loader(concat, batch_size=4, seed=9, timeout=60)])
    want = torch.cat([x for x, _ in fastpipe.Loader(whole, batch_size=4, seed=9, timeout=60)])
    assert torch.equal(got, want), "the ConcatDataset reads as one ImageFolder of its parts' samples"


def test_torchvision_folders_as_torchvision_reads_them(tmp_path, rng):
    torchvision = pytest.importorskip("torchvision")
    import torchvision.transforms as T

    # Shrunk less than 2x: the path without DCT scaling, within a level of PIL's (README: accuracy)
    make_tree(tmp_path / "a", rng, [(int(h), int(w)) for h, w in rng.integers(24, 40, (6, 2))])
    make_tree(tmp_path / "b", rng, [(int(h), int(w)) for h, w in rng.integers(24, 40, (5, 2))])

    def folder(d):
        return torchvision.datasets.ImageFolder(str(tmp_path / d), transform=T.Compose(
            [T.Resize(24), T.CenterCrop(16), T.PILToTensor()]))

    concat = torch.utils.data.ConcatDataset([folder("a"), folder("b")])
    ours = list(fastpipe.Loader(concat, batch_size=4, timeout=60))
    theirs = list(torch.utils.data.DataLoader(concat, batch_size=4))
    assert [y.tolist() for _, y in ours] == [y.tolist() for _, y in theirs]
    x, want = torch.cat([x for x, _ in ours]), torch.cat([x for x, _ in theirs])
    assert x.shape == want.shape and (x.int() - want.int()).abs().max() <= 1


def test_parts_that_cannot_be_read_as_one_are_refused(tmp_path, rng, dataset_factory):
    make_tree(tmp_path / "a", rng, sizes(rng, 4))
    a = fastpipe.ImageFolder(str(tmp_path / "a"), transform=CenterCrop(16))
    npy, _, _ = dataset_factory(5, {"x": ("uint8", (3,))})
    with pytest.raises(TypeError, match="part 1 is NpyDataset: write the ConcatDataset once"):
        fastpipe.Loader(torch.utils.data.ConcatDataset([a, npy]))
    other = fastpipe.ImageFolder(str(tmp_path / "a"), transform=CenterCrop(20))
    with pytest.raises(ValueError, match="must share one transform"):
        fastpipe.Loader(torch.utils.data.ConcatDataset([a, other]))
    relabelled = fastpipe.ImageFolder(str(tmp_path / "a"), transform=CenterCrop(16), target_transform=lambda y: y + 1)
    with pytest.raises(ValueError, match="must share one target_transform"):
        fastpipe.Loader(torch.utils.data.ConcatDataset([a, relabelled]))


def test_tensor_datasets_joined_as_dataloader_reads_them(rng):
    def part(n):
        return torch.utils.data.TensorDataset(torch.from_numpy(rng.standard_normal((n, 3)).astype(np.float32)),
                                              torch.from_numpy(rng.integers(0, 9, n)))

    a, b = part(40), part(27)
    concat = torch.utils.data.ConcatDataset([a, torch.utils.data.Subset(b, [26, 3, 3, 10]), a])
    loader = fastpipe.Loader(concat, batch_size=9, timeout=60)
    assert loader.dataset is concat and len(loader) == 10
    ours = [tuple(t.clone() for t in batch) for batch in loader]
    theirs = list(torch.utils.data.DataLoader(concat, batch_size=9))
    assert len(ours) == len(theirs)
    for (x, y), (rx, ry) in zip(ours, theirs, strict=True):
        assert torch.equal(x, rx) and torch.equal(y, ry)


def test_tensor_datasets_that_do_not_batch_together_are_refused(rng):
    a = torch.utils.data.TensorDataset(torch.zeros(4, 3), torch.zeros(4))
    with pytest.raises(ValueError, match="hold different numbers of tensors"):
        fastpipe.Loader(torch.utils.data.ConcatDataset([a, torch.utils.data.TensorDataset(torch.zeros(4, 3))]))
    with pytest.raises(ValueError, match=r"tensors\[0\] of the ConcatDataset's TensorDatasets differ"):
        fastpipe.Loader(torch.utils.data.ConcatDataset([a, torch.utils.data.TensorDataset(torch.zeros(4, 5),
                                                                                          torch.zeros(4))]))
