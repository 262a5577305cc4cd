"""find_batch_size: the largest batch a training step fits in memory, found by doubling then bisection."""

import dataclasses
import gc
import numbers

import torch

# Allocation failures that do not raise torch.OutOfMemoryError: cuDNN/cuBLAS workspaces, the CPU allocator.
_OOM_MESSAGES = ("CUDNN_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_ALLOC_FAILED",
                 "DefaultCPUAllocator: can't allocate memory")


@dataclasses.dataclass(frozen=True)
class BatchSizeResult:
    """What :func:`find_batch_size` found.

    Attributes
    ----------
    batch_size : int
        The largest batch size that fits.
    peak_bytes : int
        Peak memory of a training step at that batch size (see :func:`find_batch_size`).
    free_bytes : int
        ``limit_bytes - peak_bytes``: the headroom it leaves under the limit.
    limit_bytes : int
        The limit the tries were held to.
    tries : list of (int, bool, int or None)
        Every try in order: (batch size, fits, peak bytes; None when it ran out of memory).
    """

    batch_size: int
    peak_bytes: int
    free_bytes: int
    limit_bytes: int
    tries: list


def _is_oom(e):
    return isinstance(e, torch.cuda.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and any(m in str(e) for m in _OOM_MESSAGES))


def _to(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    return obj


def _default_loss(out):
    if isinstance(out, torch.Tensor):
        return out.float().mean()
    leaves = out.values() if isinstance(out, dict) else out
    return sum(_default_loss(o) for o in leaves)


def _train_step(model, sample_batch_fn, batch_size, device, loss_fn, optimizer_fn):
    optimizer = optimizer_fn(model.parameters()) if optimizer_fn is not None else None
    batch = sample_batch_fn(batch_size)
    if isinstance(batch, torch.Tensor):
        inputs, target = batch, None
    elif isinstance(batch, tuple) and len(batch) == 2:
        inputs, target = batch
    else:
        raise TypeError("sample_batch_fn must return inputs or a tuple (inputs, target), got "
                        f"{type(batch).__name__}{f' of {len(batch)}' if isinstance(batch, tuple) else ''}")
    inputs, target = _to(inputs, device), _to(target, device)
    if isinstance(inputs, (tuple, list)):
        out = model(*inputs)
    elif isinstance(inputs, dict):
        out = model(**inputs)
    else:
        out = model(inputs)
    loss = loss_fn(out, target) if loss_fn is not None else _default_loss(out)
    loss.backward()
    if optimizer is not None:
        optimizer.step()


def _cpu_peak_bytes(fn):
    """Peak bytes that ``fn()`` holds in CPU tensors at once (kernels' scratch space included).

    The profiler reports every allocation and free of the CPU allocator, in this thread and in the
    intra-op threads working for it; the running sum of their sizes peaks at the answer.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    cpu = torch._C._autograd.DeviceType.CPU
    events = sorted((e for e in prof.profiler.kineto_results.events()
                     if e.name() == "[memory]" and e.device_type() == cpu), key=lambda e: e.start_ns())
    held = peak = 0
    for e in events:
        held += e.nbytes()  # negative for a free
        peak = max(peak, held)
    return peak


def _free_memory(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _check_int(name, value, low):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


def find_batch_size(model, sample_batch_fn, optimizer_fn=None, max_memory_fraction=0.9, start=1, max_batch=65536,
                    memory_limit=None, device=None, loss_fn=None):
    """The largest batch size whose training step (forward, backward, optimizer step) fits in memory.

    Tries ``start``, doubling until a try does not fit or ``max_batch`` is reached, then bisects
    between the largest size that fitted and the smallest that did not. A try does not fit when it
    runs out of memory or when its peak memory exceeds the limit. Memory is freed between tries and
    the model is left as it was: parameters and buffers (restored bit for bit), gradients, each
    module's training mode, and the random number generators' state.

    Parameters
    ----------
    model : torch.nn.Module
        The model, already on its device. Tries run it in training mode.
    sample_batch_fn : callable
        ``sample_batch_fn(batch_size)`` returns ``inputs`` or ``(inputs, target)``; ``inputs`` is a
        tensor (``model(inputs)``), a tuple or list (``model(*inputs)``) or a dict
        (``model(**inputs)``). Tensors not on ``device`` are moved there.
    optimizer_fn : callable, optional
        ``optimizer_fn(model.parameters())`` builds the optimizer, e.g.
        ``functools.partial(torch.optim.AdamW, lr=1e-3)``; each try builds a fresh one and takes one
        step, so that its state (Adam's moments) is counted. Without it tries stop after backward.
    max_memory_fraction : float
        On CUDA, the share of the device's total memory a try may use, in (0, 1].
    start : int
        The first batch size tried (>= 1).
    max_batch : int
        The largest batch size tried (>= start).
    memory_limit : int, optional
        Bytes a try may use. Required on CPU, which has no out-of-memory error to stop at; on CUDA
        the limit is the smaller of this and ``max_memory_fraction`` of the device's memory.
    device : str or torch.device, optional
        Where the step runs; default: the device of the model's first parameter.
    loss_fn : callable, optional
        ``loss_fn(output, target)``; default: ``output.float().mean()`` (summed over the tensors of a
        tuple or dict output), the target unused. The loss's own memory is small next to the
        activations', so the default measures nearly what a real loss does.

    Returns
    -------
    BatchSizeResult

    Raises
    ------
    RuntimeError
        When even batch size 1 does not fit.
    Exception
        An error of a try other than running out of memory propagates unchanged, with a note that
        names the batch size.

    Notes
    -----
    Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` (all the process's tensors on the
    device, the model included); on CPU the model's parameters and buffers plus the peak of what
    the try allocates (inputs, activations, gradients, optimizer state, kernels' scratch space),
    measured with ``torch.profiler``, so a CPU search cannot run inside another profiler. Run under
    ``torch.autocast`` to size a mixed-precision step. A search costs about
    ``2 * log2(batch_size) + 1`` training steps; on CPU a try before the first failure may allocate up
    to about twice ``memory_limit``.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not callable(sample_batch_fn):
        raise TypeError(f"sample_batch_fn must be callable, got {type(sample_batch_fn).__name__}")
    start = _check_int("start", start, 1)
    max_batch = _check_int("max_batch", max_batch, start)
    if isinstance(max_memory_fraction, bool) or not isinstance(max_memory_fraction, numbers.Real) or not (
            0 < max_memory_fraction <= 1):
        raise ValueError(f"max_memory_fraction must be in (0, 1], got {max_memory_fraction!r}")
    if memory_limit is not None:
        memory_limit = _check_int("memory_limit", memory_limit, 1)
    if device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        total = torch.cuda.get_device_properties(device).total_memory
        limit = int(max_memory_fraction * total)
        if memory_limit is not None:
            limit = min(limit, memory_limit)
    elif device.type == "cpu":
        if memory_limit is None:
            raise ValueError("memory_limit (bytes) is required on CPU: the CPU has no out-of-memory error to "
                             "stop at, so tries are held to the limit you give")
        if torch.autograd._profiler_enabled():
            raise RuntimeError("find_batch_size on CPU measures memory with torch.profiler: call it outside a "
                               "profiler")
        limit = memory_limit
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                    for t in (*model.parameters(), *model.buffers())}
        model_bytes = sum(storages.values())
    else:
        raise ValueError(f"device must be a CPU or CUDA device, got {device}")

    def attempt(batch_size):
        def step():
            _train_step(model, sample_batch_fn, batch_size, device, loss_fn, optimizer_fn)

        _free_memory(device)
        try:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                step()
                torch.cuda.synchronize(device)  # a kernel's error surfaces in its own try
                peak = torch.cuda.max_memory_allocated(device)
            else:
                peak = model_bytes + _cpu_peak_bytes(step)
        except Exception as e:
            if not _is_oom(e):
                if hasattr(e, "add_note"):  # Python >= 3.11
                    e.add_note(f"(raised by find_batch_size's try at batch size {batch_size})")
                raise
            peak = None  # the next try frees the memory, once the exception and its frames' tensors are gone
        finally:
            model.zero_grad(set_to_none=True)
        fits = peak is not None and peak <= limit
        tries.append((batch_size, fits, peak))
        return fits

    modes = [(m, m.training) for m in model.modules()]
    saved = {k: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v
             for k, v in model.state_dict().items()}  # on the host: a device copy would take the tries' memory
    grads = [(p, p.grad.detach().to("cpu", copy=True)) for p in model.parameters() if p.grad is not None]
    tries = []
    gc.collect()
    # Collections between tries then scan only what the search made (~1 ms, not ~0.2 s with torch's
    # objects). Skipped when the program froze objects itself: unfreeze() would thaw those too.
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        model.zero_grad(set_to_none=True)
        model.train()
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            attempt(start)  # a first step's one-time allocations (kernel caches, lazy init) are no batch's
            tries.clear()
            good, bad = 0, None
            size = start
            while True:
                if not attempt(size):
                    bad = size
                    break
                good = size
                if size >= max_batch:
                    break
                size = min(2 * size, max_batch)
            while bad is not None and bad - good > 1:
                mid = (good + bad) // 2
                if attempt(mid):
                    good = mid
                else:
                    bad = mid
    finally:
        model.zero_grad(set_to_none=True)
        model.load_state_dict(saved)
        for m, training in modes:
            m.training = training
        for p, g in grads:
            p.grad = g.to(p.device)
        _free_memory(device)
        if freeze:
            gc.unfreeze()
    if good == 0:
        raise RuntimeError(f"even batch size 1 does not fit in {limit} bytes on {device}: tries {tries}")
    peak = next(p for b, fits, p in tries if b == good and fits)
    return BatchSizeResult(batch_size=good, peak_bytes=peak, free_bytes=limit - peak, limit_bytes=limit, tries=tries)
