"""A torch Subset (random_split's) of a fastpipe dataset given to the Loader, as users give one to DataLoader:
its records, in its positions, checked against the dataset's own bytes and items (numpy, __getitem__)."""

import numpy as np
import pytest
import torch

import fastpipe
from fastpipe._ext import _C
from fastpipe.transforms import RandomResizedCrop

from jpegs import jpeg_bytes, make_tree, picture
from remote_data import loader as remote_loader
from remote_data import served, shards
from servers import FAST
from tar_files import tar_bytes


def records_read(loader):
    return np.concatenate([b["idx"].numpy() for b in loader])


def test_random_split_reads_each_part_in_order_and_shuffled(dataset_factory, fp, rng):
    ds, arrays, _ = dataset_factory(211, {"x": ("float32", (5,)), "y": ("uint8", (3,))})
    split = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
    train, val = torch.utils.data.random_split(ds, [0.8, 0.2], generator=split)
    ordered = fp.loader(val, 6)
    assert len(ordered.dataset) == len(val) == 42 and len(ordered) == 7
    assert repr(ordered).startswith("Loader(Subset(42 of NpyDataset(211 records;")
    assert fp.verify(fp.epoch(ordered), arrays).tolist() == list(val.indices)
    shuffled = fp.loader(train, 8, shuffle=True, drop_last=True)
    epochs = [fp.verify(fp.epoch(shuffled), arrays) for _ in range(2)]
    for idx in epochs:
        assert len(idx) == len(train) // 8 * 8 and len(set(idx.tolist())) == len(idx)
        assert set(idx.tolist()) <= set(train.indices)
    assert epochs[0].tolist() != epochs[1].tolist(), "each epoch must be shuffled anew"


def test_nested_subsets_negative_and_tensor_indices(dataset_factory, fp):
    ds, arrays, _ = dataset_factory(50, {"x": ("int16", (4,))})
    inner = torch.utils.data.Subset(ds, torch.tensor([-1, 3, 7, 0, 49, 12, 5]))
    outer = torch.utils.data.Subset(inner, range(6, 0, -2))
    want = [ds[int(i) % 50]["idx"].item() for i in (inner.indices[6], inner.indices[4], inner.indices[2])]
    assert [outer[i]["idx"].item() for i in range(3)] == want  # torch's own reading of the Subsets
    assert fp.verify(fp.epoch(fp.loader(outer, 2)), arrays).tolist() == want


def test_a_sampler_indexes_the_subset(dataset_factory, fp):
    ds, arrays, _ = dataset_factory(90, {"x": ("float64", ())})
    part = torch.utils.data.Subset(ds, np.arange(3, 90, 2))  # 44 records
    seen = []
    for rank in range(3):
        sampler = torch.utils.data.DistributedSampler(part, num_replicas=3, rank=rank, shuffle=True, seed=4)
        want = [part.indices[i] for i in sampler]
        got = fp.verify(fp.epoch(fp.loader(part, 5, sampler=sampler)), arrays).tolist()
        assert got == want, f"rank {rank}"
        seen += got
    assert set(seen) == set(part.indices.tolist())


def test_resume_within_a_subset(dataset_factory, fp):
    ds, arrays, _ = dataset_factory(120, {"x": ("uint8", (7,))})
    part = torch.utils.data.Subset(ds, np.random.default_rng(2).permutation(120)[:77])
    whole = fp.verify(fp.epoch(fp.loader(part, 6, shuffle=True, seed=9)), arrays)
    first = fp.loader(part, 6, shuffle=True, seed=9)
    head = fp.verify(fp.take(iter(first), 4), arrays)
    resumed = fp.loader(part, 6, shuffle=True, seed=9)
    resumed.load_state_dict(first.state_dict())
    tail = fp.verify(fp.epoch(resumed), arrays)
    assert np.concatenate([head, tail]).tolist() == whole.tolist()


def test_a_subset_of_images_reads_each_record_as_the_dataset_does(tmp_path, rng):
    make_tree(tmp_path / "images", rng, [(int(h), int(w)) for h, w in rng.integers(20, 60, (12, 2))])
    ds = fastpipe.ImageFolder(str(tmp_path / "images"), transform=RandomResizedCrop(16))
    picked = [9, 2, 11, 4, 7]
    loader = fastpipe.Loader(torch.utils.data.Subset(ds, picked), batch_size=2, seed=0, timeout=60)
    images = torch.cat([x for x, _ in loader])
    labels = torch.cat([y for _, y in loader])
    # ds[i]: record i's transform in epoch 0 with seed 0, the random draws the record's own
    assert torch.equal(images, torch.stack([ds[i][0] for i in picked]))
    assert labels.tolist() == [ds.targets[i] for i in picked]


def test_random_split_of_a_torchvision_image_folder(tmp_path, rng):
    torchvision = pytest.importorskip("torchvision")
    import torchvision.transforms as T

    # Shrunk less than 2x: the path without DCT scaling, within a level of PIL's (README: accuracy)
    make_tree(tmp_path / "images", rng, [(int(h), int(w)) for h, w in rng.integers(24, 40, (10, 2))])
    tv = torchvision.datasets.ImageFolder(str(tmp_path / "images"), transform=T.Compose(
        [T.Resize(24), T.CenterCrop(16), T.PILToTensor()]))
    train, val = torch.utils.data.random_split(tv, [7, 3], generator=torch.Generator().manual_seed(1))
    loader = fastpipe.Loader(val, batch_size=3, timeout=60)
    assert loader.dataset is val
    (x, y), = list(loader)
    assert y.tolist() == [tv.targets[i] for i in val.indices]
    want = torch.stack([tv[i][0] for i in val.indices])  # torchvision's own PIL path
    assert x.shape == want.shape and (x.int() - want.int()).abs().max() <= 1


def test_bad_subsets_are_refused_with_the_reason(dataset_factory, tmp_path, rng):
    ds, _, _ = dataset_factory(10, {"x": ("uint8", ())})
    with pytest.raises(IndexError, match="Subset index 10 is out of range for its dataset of 10 records"):
        fastpipe.Loader(torch.utils.data.Subset(ds, [0, 10]))
    with pytest.raises(TypeError, match="indices must be integers"):
        fastpipe.Loader(torch.utils.data.Subset(ds, [0.5, 1.0]))
    with pytest.raises(ValueError, match="the dataset is empty"):
        fastpipe.Loader(torch.utils.data.Subset(ds, []))
    with pytest.raises(TypeError, match="or a ConcatDataset of image folders or TensorDatasets, got list"):
        fastpipe.Loader(torch.utils.data.Subset([1, 2, 3], [0]))
    members = [(f"{k}.{ext}", data) for k in "ab" for ext, data in (("jpg", jpeg_bytes(picture(rng, 20, 20))),
                                                                      ("cls", b"1"))]
    (tmp_path / "s.tar").write_bytes(tar_bytes(members))
    wds = fastpipe.WebDataset([str(tmp_path / "s.tar")], transform=RandomResizedCrop(16))
    with pytest.raises(ValueError, match="a Subset of it picks records"):
        fastpipe.Loader(torch.utils.data.Subset(wds, [1]), shuffle="blocks")


@pytest.mark.skipif(not _C.HTTP_AVAILABLE, reason="built without libcurl (`make setup` installs it)")
def test_a_subset_of_remote_shards_reads_what_the_local_subset_reads(faulty, tmp_path, rng):
    """Remote shards fetched ahead in the Subset's order: the same batches as the local shards' Subset."""
    urls, paths = served(faulty, tmp_path, shards(rng, 5, pad=False))
    ds = fastpipe.WebDataset(urls, storage_options=FAST, cache_dir=tmp_path / "cache", index_cache="off")
    local = fastpipe.WebDataset(paths, index_cache="off")
    picked = rng.permutation(len(ds))[: len(ds) * 2 // 3].tolist()
    seed = int(rng.integers(1 << 30))
    ours = remote_loader(torch.utils.data.Subset(ds, picked), shuffle=True, seed=seed)
    theirs = remote_loader(torch.utils.data.Subset(local, picked), shuffle=True, seed=seed)
    for _ in range(2):
        got = [(x.numpy(), y.numpy()) for x, y in ours]
        want = [(x.numpy(), y.numpy()) for x, y in theirs]
        assert len(got) == len(want) == -(-len(picked) // 3)
        for (x, y), (rx, ry) in zip(got, want, strict=True):
            np.testing.assert_array_equal(y, ry)
            np.testing.assert_array_equal(x, rx)
    assert sorted(np.concatenate([y for _, y in got]).tolist()) == sorted(local.targets[i] for i in picked)
