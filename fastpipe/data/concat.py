"""A ``torch.utils.data.ConcatDataset`` of image folders (fastpipe's or torchvision's, or Subsets of them),
given to the Loader as it is given to DataLoader: read as one ImageFolder of the parts' samples in turn,
each with its own label. Other parts are refused with what to do instead."""

import torch

from fastpipe.data import subsets, torchvision_compat


def is_concat(dataset):
    return isinstance(dataset, torch.utils.data.ConcatDataset)


def image_folder(dataset):
    """fastpipe.ImageFolder of ``dataset``'s parts' samples, in the ConcatDataset's order."""
    from fastpipe.data.images import ImageFolder

    samples, folders = [], []
    for k, part in enumerate(dataset.datasets):
        source, records = subsets.unwrap(part)
        if torchvision_compat.is_torchvision_folder(source):
            source = torchvision_compat.convert_dataset(source)
        if not isinstance(source, ImageFolder):
            raise TypeError(f"fastpipe.Loader reads a ConcatDataset of image folders (fastpipe's or torchvision's "
                            f"ImageFolder, or Subsets of them); part {k} is {type(source).__name__}: write the "
                            f"ConcatDataset once as one dataset, `fastpipe.write_npy(concat, out_dir)` (tensors) or "
                            f"`fastpipe.write_images(concat, out_dir)` (images and labels), and pass that")
        part_samples = source.samples
        samples += part_samples if records is None else [part_samples[i] for i in records.tolist()]
        folders.append(source)
    first = folders[0]
    for k, folder in enumerate(folders[1:], 1):
        for what in ("transform", "target_transform"):
            mine, theirs = getattr(folder, what), getattr(first, what)
            same = repr(mine) == repr(theirs) if what == "transform" else mine is theirs
            if not same:
                raise ValueError(f"the parts of a ConcatDataset given to fastpipe.Loader must share one {what} (their "
                                 f"batches are read alike): part 0 has {theirs!r}, part {k} {mine!r}")
    same_classes = all(f.classes == first.classes for f in folders)
    return ImageFolder(transform=first.transform, target_transform=first.target_transform, samples=samples,
                       classes=first.classes if same_classes else None)
