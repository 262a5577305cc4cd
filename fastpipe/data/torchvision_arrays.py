"""torchvision's in-memory image datasets (CIFAR10, CIFAR100, MNIST, FashionMNIST, KMNIST, ...) given to
``fastpipe.Loader`` as they are: their ``data`` and ``targets`` written once as ``.npy`` columns under the
cache (keyed by the bytes), read by :class:`fastpipe.NpyDataset`, and their transform pipeline turned into
the :class:`fastpipe.transforms.CropMirrorNormalize` that does the same (or an error naming the step that
has none).

Understood, in torchvision's v1 and v2 spellings: ``Compose``; ``RandomCrop`` (``padding`` an int, zeros:
CIFAR's ``RandomCrop(32, padding=4)``, or ``Pad(4)`` + ``RandomCrop(32)``); ``CenterCrop``;
``RandomHorizontalFlip``; ``ToTensor``, or ``ToImage`` / ``PILToTensor`` + ``ToDtype(torch.float32,
scale=True)``; ``Normalize``; v2's ``ToPureTensor``.
"""

import hashlib
import os
import sys

import numpy as np
import torch

from fastpipe._cache_home import cache_home


def is_arrays_dataset(dataset):
    """Whether ``dataset`` is torchvision's CIFAR10/CIFAR100 (uint8 (N, H, W, 3) arrays) or MNIST,
    FashionMNIST, KMNIST or EMNIST (uint8 (N, H, W) tensors): datasets whose item is the PIL image of
    ``data[i]`` and ``targets[i]``. (SVHN keeps CHW data, QMNIST more than a label per target: not these.)"""
    datasets = sys.modules.get("torchvision.datasets")  # imported wherever one of its datasets exists
    if datasets is None or isinstance(dataset, datasets.QMNIST):
        return False
    return isinstance(dataset, (datasets.CIFAR10, datasets.MNIST))


def convert_dataset(dataset):
    """(NpyDataset of (image, label) records, its CropMirrorNormalize) for torchvision's ``dataset``; its
    ``target_transform`` maps the labels of each batch (fastpipe/data/_collate.py)."""
    from fastpipe.data.npy import NpyDataset

    transform = convert_transform(getattr(dataset, "transform", None))
    data = dataset.data.numpy() if isinstance(dataset.data, torch.Tensor) else np.asarray(dataset.data)
    if data.ndim == 3:  # MNIST's (N, H, W): one channel
        data = data[..., None]
    targets = np.asarray(dataset.targets.numpy() if isinstance(dataset.targets, torch.Tensor) else dataset.targets,
                         dtype=np.int64)
    if targets.shape != (len(data),):
        raise ValueError(f"{type(dataset).__name__} has {len(data)} images but {targets.shape} targets")
    images, labels = _written(type(dataset).__name__, np.ascontiguousarray(data), targets)
    ds = NpyDataset((images, labels))
    ds.target_transform = getattr(dataset, "target_transform", None)  # applied per label, as by image datasets
    return ds, transform


def _written(name, data, targets):
    """The two columns' .npy files under the cache, written once for these bytes."""
    h = hashlib.sha256()
    for a in (data, targets):
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(memoryview(a).cast("B"))
    folder = cache_home("torchvision_arrays", f"{name}-{h.hexdigest()[:24]}")
    paths = [os.path.join(folder, f) for f in ("image.npy", "label.npy")]
    if not all(os.path.exists(p) for p in paths):
        os.makedirs(folder, exist_ok=True)
        for p, a in zip(paths, (data, targets)):
            partial = f"{p}.partial-{os.getpid()}"  # renamed whole: a reader never sees a partial file
            with open(partial, "wb") as f:
                np.save(f, a)
            os.replace(partial, p)
    return paths


def convert_transform(transform):
    """The CropMirrorNormalize doing what a torchvision pipeline does to a PIL image of an in-memory
    dataset, for uint8 (H, W, C) records; ValueError naming the step it cannot do."""
    from fastpipe.transforms import CropMirrorNormalize

    steps = list(getattr(transform, "transforms", None) or ([] if transform is None else [transform]))
    crop = None
    random_crop, padding, mirror, to_float, mean, std = False, 0, 0.0, False, None, None
    padded = None  # a Pad waiting for its RandomCrop: the zeros on every side
    for step in steps:
        name = type(step).__name__
        if name == "ToPureTensor":
            continue
        if padded is not None and name != "RandomCrop":
            _refuse(step, "after a Pad: a Pad is fused as the padding of the RandomCrop right after it")
        if crop is None and not to_float and name == "Pad" and padded is None:
            padded = _even_zero_padding(step)
        elif crop is None and not to_float and name in ("RandomCrop", "CenterCrop"):
            size = tuple(step.size)
            if name == "RandomCrop":
                if step.pad_if_needed:
                    _refuse(step, "pad_if_needed")
                random_crop, padding = True, (padded or 0) + (_even_zero_padding(step) if step.padding else 0)
                padded = None
            crop = size
        elif name == "RandomHorizontalFlip" and not to_float:
            mirror = float(step.p)
        elif name == "ToTensor" and not to_float:
            to_float = True
        elif name in ("ToImage", "PILToTensor") and not to_float:
            continue
        elif name in ("ToDtype", "ConvertImageDtype") and not to_float:
            if step.dtype != torch.float32 or not (name == "ConvertImageDtype" or step.scale):
                _refuse(step, "only ToDtype(torch.float32, scale=True)")
            to_float = True
        elif name == "Normalize" and to_float and mean is None:
            mean, std = [float(m) for m in step.mean], [float(s) for s in step.std]
        else:
            _refuse(step, "not supported here, or not at this place in the pipeline")
    if padded is not None:
        raise ValueError("fastpipe.Loader fuses torchvision's Pad only as the padding of a RandomCrop right after it; "
                         "this pipeline has none there")
    if not to_float:
        raise ValueError("fastpipe.Loader needs the torchvision pipeline to end in float tensors (ToTensor(), or "
                         "ToImage() + ToDtype(torch.float32, scale=True)), as DataLoader's collate needs tensors")
    return CropMirrorNormalize(mean if mean is not None else 0.0, std if std is not None else 1.0, crop=crop,
                               random_crop=random_crop, padding=padding, mirror=mirror)


def _even_zero_padding(step):
    """A Pad's or RandomCrop's padding as the one int of zeros on every side that CropMirrorNormalize pads."""
    from fastpipe.data.torchvision_compat import zero_padding

    try:
        sides = set(zero_padding(step, step.padding))
    except (TypeError, ValueError) as e:
        _refuse(step, f"padding other than one int of zeros: {e}")
    if len(sides) != 1:
        _refuse(step, "padding other than one int of zeros")
    return sides.pop()


def _refuse(step, why):
    raise ValueError(f"fastpipe.Loader cannot fuse torchvision's {type(step).__name__} of an in-memory dataset "
                     f"({why}). It fuses RandomCrop (zero padding, a Pad of zeros before it), CenterCrop, "
                     f"RandomHorizontalFlip, ToTensor (or ToImage + ToDtype(float32, scale=True)), Normalize; "
                     f"or write the dataset once with "
                     f"fastpipe.write_npy(dataset, out_dir) and give CropMirrorNormalize your own steps")
