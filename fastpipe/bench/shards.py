"""The images suite's JPEG corpus as WebDataset shards, and the webdataset package's loader over them: what
benchmarks/webdataset_local.py and the remote suite (fastpipe/bench/remote.py) share."""

import io
import os
import tarfile

import torch

import fastpipe
from fastpipe.bench.image_corpus import corpus_paths, ensure_corpus

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def write_shards(tree, out_dir, per_shard):
    """The tree's images as shards of per_shard samples, in a shuffled order (as shards are written); shards
    written before are kept (each is renamed into place only when complete)."""
    folder = fastpipe.ImageFolder(tree, cache_dir="off")
    order = torch.randperm(len(folder), generator=torch.Generator().manual_seed(0)).tolist()
    os.makedirs(out_dir, exist_ok=True)
    shards = []
    for s in range(0, len(order), per_shard):
        path = os.path.join(out_dir, f"shard-{s // per_shard:06d}.tar")
        if os.path.exists(path):
            shards.append(path)
            continue
        with tarfile.open(path + ".partial", "w") as tar:
            for i in order[s:s + per_shard]:
                img, label = folder.samples[i]
                for name, data in ((f"s{i:07d}.jpg", open(img, "rb").read()), (f"s{i:07d}.cls", str(label).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        os.replace(path + ".partial", path)
        shards.append(path)
    return shards


def corpus_shards(data_dir, images, per_shard, threads, out):
    """The images suite's corpus (made when missing) and its shards: (corpus paths, shard paths)."""
    c = corpus_paths(data_dir, images, 0, 14.0)
    ensure_corpus(c, images, 0, 14.0, threads, out)
    return c, write_shards(c.tree, os.path.join(os.path.dirname(c.tree), f"shards_{per_shard}"), per_shard)


def images_of(tree):
    """The image folder's files and labels, as torchvision's ImageFolder lists them."""
    classes = sorted(e.name for e in os.scandir(tree) if e.is_dir())
    images, labels = [], []
    for label, c in enumerate(classes):
        for name in sorted(os.listdir(os.path.join(tree, c))):
            images.append(os.path.join(tree, c, name))
            labels.append(label)
    return images, labels


def pil_transform(size):
    """The peers' transforms of a PIL image: torchvision v2 RandomResizedCrop(size) + flip + ImageNet
    normalisation, to float32 CHW."""
    from torchvision.transforms import v2

    return v2.Compose([v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip(), v2.PILToTensor(),
                       v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])


def webdataset_row(shards, size, batch, threads):
    import webdataset as wds

    tf = pil_transform(size)
    ds = (wds.WebDataset(shards, shardshuffle=len(shards), nodesplitter=wds.split_by_node, empty_check=False)
          .shuffle(1000).decode("pil").to_tuple("jpg", "cls").map_tuple(tf, lambda c: c))
    return {"webdataset + WebLoader": lambda: wds.WebLoader(ds.batched(batch, partial=False), batch_size=None,
                                                            num_workers=threads)}
