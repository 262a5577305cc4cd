"""torch's ``TensorDataset`` given to ``fastpipe.Loader`` as it is given to DataLoader: its tensors written
once, when the Loader is made, as ``.npy`` columns in a temporary folder of this process (the page cache
holds them, so they are read at memory speed; the folder goes with the dataset), read by
:class:`fastpipe.NpyDataset`. Changes made to the tensors after that are not seen: make a new Loader."""

import os
import shutil
import tempfile
import weakref

import numpy as np
import torch

# What a .npy column holds (NpyDataset's dtypes), as torch names them.
_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.uint16, torch.int32, torch.int64, torch.float16,
           torch.float32, torch.float64)


def is_tensor_dataset(dataset):
    return isinstance(dataset, torch.utils.data.TensorDataset)


def convert_dataset(dataset):
    """NpyDataset of ``dataset``'s tensors (a tuple per batch, as the TensorDataset's items)."""
    from fastpipe.data.npy import NpyDataset

    arrays = [_array(t, k) for k, t in enumerate(dataset.tensors)]
    if not arrays:
        raise ValueError("the TensorDataset holds no tensors")
    folder = tempfile.mkdtemp(prefix="fastpipe-tensors-")
    try:
        paths = []
        for k, a in enumerate(arrays):
            paths.append(os.path.join(folder, f"{k}.npy"))
            np.save(paths[-1], a)
        ds = NpyDataset(paths)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    weakref.finalize(ds, shutil.rmtree, folder, True)  # a reader that still maps a file keeps it until closed
    return ds


def _array(tensor, k):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"TensorDataset's tensors[{k}] is a {type(tensor).__name__}, not a tensor")
    if tensor.device.type != "cpu":
        raise ValueError(f"TensorDataset's tensors[{k}] is on {tensor.device}: fastpipe.Loader reads host memory "
                         f"(a dataset already on the device is batched fastest by indexing it there, "
                         f"tensor[batch_indices])")
    if tensor.dtype not in _DTYPES:
        raise ValueError(f"TensorDataset's tensors[{k}] is {tensor.dtype}, which fastpipe does not read (it reads "
                         f"{', '.join(str(d).replace('torch.', '') for d in _DTYPES)}): convert it, e.g. "
                         f"tensor.float()")
    if tensor.dim() == 0:
        raise ValueError(f"TensorDataset's tensors[{k}] has no dimension to index")
    return tensor.detach().contiguous().numpy()
