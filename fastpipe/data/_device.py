"""Where a Loader's batches live: the CPU, a CUDA device, or (tests only) a CPU simulation of one.

``simulated(...)`` makes ``Loader(device="cuda")`` run the whole device pipeline on a simulated device
(core/sim_device.h): streams are worker threads with random delays, memory is host memory, and the
batches are CPU tensors. Tests use it to exercise the pipeline's ordering on machines without a GPU.
"""

import contextlib
import os

import torch

from fastpipe._ext import _C, build_info

_simulation = None


@contextlib.contextmanager
def simulated(max_delay_us=0, seed=0):
    """Loaders made inside the block put their batches on a simulated device; yields the SimDevice."""
    global _simulation
    old, _simulation = _simulation, _C.SimDevice(max_delay_us=max_delay_us, seed=seed)
    try:
        yield _simulation
    finally:
        _simulation = old


def resolve(device):
    """``(torch.device of the batches, the reader's device argument)`` for a Loader's ``device``."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:<index>', got {device!r}") from None
    if dev.type == "cpu":
        return dev, None
    if dev.type != "cuda":
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:<index>', got {device!r}")
    if _simulation is not None:
        return torch.device("cpu"), _simulation
    if not build_info()["cuda"]:
        raise RuntimeError(f"device={device!r} needs fastpipe built with CUDA kernels (FASTPIPE_CUDA=0, a CPU-only "
                           "torch or no CUDA toolkit at build time); rebuild it, or use device='cpu'")
    if not torch.cuda.is_available():
        raise RuntimeError(f"device={device!r} but no CUDA device is usable here (torch.cuda.is_available() is "
                           "False); use device='cpu'")
    index = dev.index if dev.index is not None else torch.cuda.current_device()  # "cuda": the current one
    return torch.device("cuda", index), index


def nvjpeg_library():
    """The path of nvJPEG's library in the nvidia-nvjpeg wheel when it is installed, else "" (the
    dynamic loader's search)."""
    import importlib.util

    for package in ("nvidia.cu13", "nvidia.nvjpeg"):
        try:
            spec = importlib.util.find_spec(package)
        except ModuleNotFoundError:
            continue
        for root in (spec.submodule_search_locations or []) if spec else []:
            path = os.path.join(root, "lib", "libnvjpeg.so.13")
            if os.path.exists(path):
                return path
    return ""


def image_decoder(image_decode, reader_device):
    """Whether a Loader decodes JPEGs on its device: ``image_decode`` ("auto", "host" or "device"; "auto" is
    $FASTPIPE_IMAGE_DECODE, else "host": the device path is off until its tests have passed on a GPU).
    Whether nvJPEG works there is the device pipeline's to say: it opens the decoder it will use when it
    is made (RuntimeError saying why)."""
    if image_decode == "auto":
        image_decode = os.environ.get("FASTPIPE_IMAGE_DECODE", "host")
        if image_decode not in ("host", "device"):
            raise ValueError(f"FASTPIPE_IMAGE_DECODE must be 'host' or 'device', got {image_decode!r}")
    if image_decode == "host":
        return False
    if reader_device is None:
        raise ValueError("image_decode='device' decodes JPEGs on the Loader's GPU: it needs device='cuda'")
    return True


def pin_device(pin_memory_device=""):
    """The device whose streams fence a pinned arena (None: pinning is impossible here)."""
    if _simulation is not None:
        return _simulation
    if not build_info()["cuda_available"]:
        return None
    dev = torch.device(pin_memory_device or "cuda")
    return dev.index if dev.index is not None else torch.cuda.current_device()


def record_stream(tensor, stream):
    """Marks a Loader's batch tensor as used on ``stream`` too.

    A batch's memory is reused once its last tensor is freed and the work queued before then on the
    current stream is done (a device batch: the stream current at ``next()``; a pinned CPU batch: the
    current stream of ``pin_memory_device`` when it is freed). Work on another stream (a side stream that
    reads a device batch, or copies a pinned one) must be declared with this, as ``Tensor.record_stream``
    does for memory torch allocated (which does not cover the Loader's arena). ``stream`` is a
    ``torch.cuda.Stream`` (or, under simulation, a stream handle of the simulated device).
    """
    if hasattr(stream, "cuda_stream"):
        if tensor.is_cuda and stream.device != tensor.device:
            raise ValueError(f"record_stream: the stream is on {stream.device} but the batch is on {tensor.device}; "
                             f"a batch can only be used on streams of its own device")
        handle = stream.cuda_stream
    else:
        handle = int(stream)
    _C.record_stream(tensor, handle)
