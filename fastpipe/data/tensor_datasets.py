"""torch's ``TensorDataset`` given to ``fastpipe.Loader`` as it is given to DataLoader: its tensors written
once, when the Loader is made, as ``.npy`` columns that go with the dataset (_scratch.py; the page cache
holds them, so they are read at memory speed), read by :class:`fastpipe.NpyDataset`. Changes made to the
tensors after that are not seen: make a new Loader."""

import numpy as np
import torch

from fastpipe.data import _scratch, writer


def is_tensor_dataset(dataset):
    return isinstance(dataset, torch.utils.data.TensorDataset)


def convert_dataset(dataset):
    """NpyDataset of ``dataset``'s tensors (a tuple per batch, as the TensorDataset's items)."""
    from fastpipe.data.npy import NpyDataset

    arrays = [_array(t, k) for k, t in enumerate(dataset.tensors)]
    if not arrays:
        raise ValueError("the TensorDataset holds no tensors")
    scratch = _scratch.ScratchArrays()
    ds = NpyDataset([scratch.add(a, f"TensorDataset's tensors[{k}]") for k, a in enumerate(arrays)])
    ds._scratch = scratch  # the files go with the dataset
    return ds


def _array(tensor, k):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"TensorDataset's tensors[{k}] is a {type(tensor).__name__}, not a tensor")
    if tensor.device.type != "cpu":
        raise ValueError(f"TensorDataset's tensors[{k}] is on {tensor.device}: fastpipe.Loader reads host memory "
                         f"(a dataset already on the device is batched fastest by indexing it there, "
                         f"tensor[batch_indices])")
    if tensor.dim() == 0:
        raise ValueError(f"TensorDataset's tensors[{k}] has no dimension to index")
    return np.ascontiguousarray(writer.to_numpy(tensor, f"TensorDataset's tensors[{k}]"))
