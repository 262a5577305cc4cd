"""A ``torch.utils.data.Subset`` (what ``random_split`` returns) of a fastpipe dataset, given to the Loader
as it is given to DataLoader: the dataset under it is read at the records its positions name."""

import numpy as np
import torch


def unwrap(dataset):
    """(The dataset under any nested Subsets, the record each position of the outermost one reads (int64),
    or None where ``dataset`` is no Subset.)"""
    records = None
    while isinstance(dataset, torch.utils.data.Subset):
        inner = dataset.dataset
        idx = np.asarray(dataset.indices).reshape(-1)  # a list (random_split's), a range, an array or a tensor
        if idx.size == 0:
            idx = idx.astype(np.int64)
        if not np.issubdtype(idx.dtype, np.integer):
            raise TypeError(f"a Subset's indices must be integers, got {idx.dtype}")
        n = len(inner)
        bad = (idx < -n) | (idx >= n)
        if bad.any():
            raise IndexError(f"Subset index {int(idx[bad][0])} is out of range for its dataset of {n} records")
        idx = np.where(idx < 0, idx + n, idx).astype(np.int64)
        records = idx if records is None else idx[records]
        dataset = inner
    return dataset, records
