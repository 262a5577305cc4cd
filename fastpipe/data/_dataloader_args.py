"""DataLoader's arguments in the Loader's terms: the dataset given becomes the fastpipe dataset read (a
Subset's records, a ConcatDataset's image folders as one, TensorDatasets and torchvision's datasets
converted); keywords for worker processes are taken and unused (there are none), and the worker and
prefetch counts, the generator and pinning become the reader's settings."""

import warnings

import torch

from fastpipe import _checks as checks
from fastpipe.data import _device, concat, subsets, tensor_datasets, torchvision_arrays, torchvision_compat
from fastpipe.data._source import ColumnSource


def source_of(dataset, transforms):
    """(The fastpipe dataset read, the records a Subset's positions name or None, the transforms) for the
    ``dataset`` and ``transforms`` given: a torchvision dataset's pipeline is fused (the Loader's own
    ``transforms`` override it)."""
    source, records = subsets.unwrap(dataset)
    if concat.is_concat(source):
        source = concat.convert_dataset(source)  # the parts in one ImageFolder or TensorDataset
    elif torchvision_compat.is_torchvision_folder(source):
        source = torchvision_compat.convert_dataset(source)  # the same folder, its transform fused
    elif tensor_datasets.is_tensor_dataset(source):
        source = tensor_datasets.convert_dataset(source)  # written once as .npy columns of this process
    elif torchvision_arrays.is_arrays_dataset(source):  # CIFAR10, MNIST, ...: written once as .npy
        source, fused = torchvision_arrays.convert_dataset(source)
        transforms = {0: fused, **dict(transforms or {})}
    if not isinstance(source, ColumnSource):
        raise TypeError(f"fastpipe.Loader reads NpyDataset, TokenDataset, ImageFolder, ImageDataset and WebDataset "
                        f"(and torch's TensorDataset, torchvision's ImageFolder, CIFAR and MNIST datasets), a Subset "
                        f"of one, or a ConcatDataset of image folders or TensorDatasets, got "
                        f"{type(source).__name__}: convert a map-style dataset once with `ds = fastpipe.write_npy("
                        f"dataset, out_dir)` (tensors) or `fastpipe.write_images(dataset, out_dir)` (encoded images or "
                        f"paths, and labels) and pass that")
    return source, records, transforms


def accept_unused(*, persistent_workers, in_order):
    """persistent_workers and in_order are what fastpipe always does; worker_init_fn and
    multiprocessing_context (taken, never used) configure worker processes, which fastpipe has none of."""
    checks.flag(persistent_workers, "persistent_workers")
    checks.flag(in_order, "in_order")


def reader_threads(num_threads, num_workers, on_device):
    """(num_threads, gather): num_threads unset takes num_workers (0: the reader decides) and, on the CPU,
    leaves the choice of where to read automatic; num_threads=0 reads in next()."""
    num_workers = checks.integer(num_workers, "num_workers", low=0)
    if num_threads is None:
        return num_workers, "threads" if on_device else "auto"
    return num_threads, "next" if num_threads == 0 else "threads"


def reader_prefetch(prefetch, prefetch_factor, num_workers):
    """DataLoader's batches in flight, prefetch_factor * max(1, num_workers), where prefetch_factor is set."""
    if prefetch_factor is None:
        return prefetch
    return checks.integer(prefetch_factor, "prefetch_factor", low=1) * max(1, num_workers)


def seed_of(seed, generator):
    """The generator's initial seed where one is given."""
    if generator is None:
        return seed
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    return generator.initial_seed()


def pinning(pin_memory, pin_memory_device, reader_device):
    """The device whose copies a CPU loader's pinned arena serves, or None (a device loader pins its host
    slots anyway; without a usable CUDA device pin_memory warns once and pins nothing)."""
    pin_memory = checks.flag(pin_memory, "pin_memory")
    if pin_memory_device and not str(pin_memory_device).startswith("cuda"):
        raise ValueError(f"pin_memory_device must be '' or a CUDA device, got {pin_memory_device!r}")
    if not pin_memory or reader_device is not None:
        return None
    pin = _device.pin_device(pin_memory_device)
    if pin is None:
        _warn_unpinned_once()
    return pin


_warned_unpinned = False


def _warn_unpinned_once():
    """Scripts pass pin_memory=True to every loader, on machines with and without a GPU: say it once."""
    global _warned_unpinned
    if not _warned_unpinned:
        _warned_unpinned = True
        warnings.warn("pin_memory=True but no usable CUDA device (or fastpipe was built without CUDA): batches "
                      "are not pinned (this warning is shown once per process)", stacklevel=4)
