"""A ``torch.utils.data.ConcatDataset`` given to the Loader as it is given to DataLoader: of image folders
(fastpipe's or torchvision's, or Subsets of them), read as one ImageFolder of the parts' samples in turn,
each with its own label; of TensorDatasets (or Subsets), as one TensorDataset of their tensors joined. Other
parts are refused with what to do instead."""

import torch

from fastpipe.data import subsets, tensor_datasets, torchvision_compat


def is_concat(dataset):
    return isinstance(dataset, torch.utils.data.ConcatDataset)


def convert_dataset(dataset):
    """The fastpipe dataset that reads ``dataset``'s parts in turn: one ImageFolder of image folders' samples,
    or one TensorDataset's columns of TensorDatasets' tensors."""
    parts = [subsets.unwrap(part) for part in dataset.datasets]
    if parts and all(tensor_datasets.is_tensor_dataset(source) for source, _ in parts):
        return tensor_datasets.convert_dataset(_joined_tensors(parts))
    return _image_folder(parts)


def _joined_tensors(parts):
    """One TensorDataset of the parts' tensors (at a Subset's records), column by column."""
    widths = {len(source.tensors) for source, _ in parts}
    if len(widths) != 1:
        raise ValueError(f"the TensorDatasets of a ConcatDataset given to fastpipe.Loader hold different numbers of "
                         f"tensors ({sorted(widths)}): their items would not batch together")
    columns = []
    for c in range(widths.pop()):
        pieces = [source.tensors[c] if records is None else source.tensors[c][torch.from_numpy(records)]
                  for source, records in parts]
        if len({(t.dtype, t.shape[1:]) for t in pieces}) != 1:
            raise ValueError(f"tensors[{c}] of the ConcatDataset's TensorDatasets differ in dtype or shape "
                             f"({', '.join(f'{t.dtype} {tuple(t.shape[1:])}' for t in pieces)}): DataLoader's "
                             f"collate could not stack them either")
        columns.append(torch.cat([t.detach() for t in pieces]))
    return torch.utils.data.TensorDataset(*columns)


def _image_folder(parts):
    """fastpipe.ImageFolder of the parts' samples, in the ConcatDataset's order."""
    from fastpipe.data.images import ImageFolder

    samples, folders = [], []
    for k, (source, records) in enumerate(parts):
        if torchvision_compat.is_torchvision_folder(source):
            source = torchvision_compat.convert_dataset(source)
        if not isinstance(source, ImageFolder):
            raise TypeError(f"fastpipe.Loader reads a ConcatDataset of image folders (fastpipe's or torchvision's "
                            f"ImageFolder) or of TensorDatasets, or Subsets of them; part {k} is "
                            f"{type(source).__name__}: write the "
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
