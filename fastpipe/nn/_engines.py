"""Which implementation ("engine") the fused convolution uses, per call key.

Every new key (device, dtype, shapes, layouts, stride/padding/dilation/groups, activation, bias and
residual present, threads, TF32) is timed once on every engine that supports it, eager PyTorch
included (the fastest of 3 to 25 interleaved calls each), and the choice is cached; an engine replaces
eager only when at least 3% faster. The environment variable FASTPIPE_CONV_ENGINE=auto|eager|<name>
overrides the choice (read once, when fastpipe loads; ``use_conv_engine`` changes it at run time); an engine that cannot run a call (e.g. oneDNN on float16 or
bfloat16 where this CPU lacks the instructions torch's oneDNN needs for them) falls back to eager with
one UserWarning naming the engine, the dtype and why; one of another device type falls back silently.
A forced engine that throws fails the call with its error, completed with the engine's name and the
call (eager's result in its place would hide the failure); forcing runs the named engine even on a key
where timing dropped it. While timing, a candidate that throws on a key is not tried on that key again:
eager runs, with one warning that carries the error. A candidate's first output for a key is also compared
with eager's (within the dtype's rounding, relative to the output's largest magnitude; TF32's where
cuDNN may use it): one that disagrees is treated the same way, with a warning saying by how much. An
engine whose kernels have not yet passed their tests on real hardware of its device (the CUDA
``epilogue`` engine, until a GPU run is recorded under benchmarks/results/) is never chosen by timing,
only run where FASTPIPE_CONV_ENGINE names it. The profiler shows the engine each call ran as
``fastpipe::conv_engine.<name>``.

On CUDA the activation's backward and the bias gradient run as ATen's ops until fastpipe's one-pass
kernel for them has passed its tests on a GPU: FASTPIPE_CONV_ACT_BACKWARD=kernel (read at the first
backward; ``use_conv_act_backward`` changes it at run time) runs the kernel, which the profiler shows as
``fastpipe::conv_act_backward.kernel``.

The backward of the convolution (after the activation's backward) is chosen the same way, per key of
its own: eager is ``aten.convolution_backward``; ``conv_engines(device, backward=True)`` lists the rest
(the ``depthwise`` kernels' backward on CUDA; on the CPU the same code as a model of the GPU's blocks,
for tests: never chosen by timing). A name forces both the forward and the backward engine it names;
one that is only one of them leaves the other to eager. The profiler shows the backward engine each
call ran as ``fastpipe::conv_engine_backward.<name>``.

The CPU choices persist, each with the margin it was made by: a key chosen decisively by one run is not
timed again by the next, which makes the same choice and skips the ~150 ms of timing per key at a
model's first call. They are kept in ``FASTPIPE_CONV_CACHE`` (default
``$XDG_CACHE_HOME/fastpipe/conv_engines.json``, i.e. ``~/.cache/fastpipe/``; ``off`` disables it), read
when ``fastpipe.nn`` is imported and merged back at exit, under the machine's fingerprint (CPU model and
flags, torch and fastpipe versions): a file shared by different machines or versions keeps each one's
choices apart. GPU choices are made per process.

A choice's margin is how much faster it ran than the runner-up and than eager (the median over the
timing's rounds of the paired time ratios) and the spread of those rounds (half their interquartile
range). A choice is *thin* when the runner-up is within 10% of it or within twice that spread: a choice
timed while the machine was busy can be that far off (0.89-0.94x fuse() against plain BN folding right
after a busy period, 0.96-1.06x on a quiet re-run), and 10% is where a wrong choice starts to cost more
than run-to-run noise. A thin choice read from the file is timed again at its first call in the process
(once, never inside a CUDA graph capture), and the two timings merge: the one more decisive in units of
its own spread is kept (a busy machine's rounds spread wide), the count of timings grows. A key still
thin after 3 timings has engines within noise of each other and is trusted as is. A choice from a
format-2 file has no margin: it is thin. ``retune()`` forgets the choices (all, or the thin ones) so that
the next calls time afresh; the file is updated at exit. ``conv_engine_cache()`` says per key where its
choice comes from (timed here, loaded from the file, re-timed), its margin, and whether it is thin.
"""

import atexit
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import platform
import tempfile
import warnings

import torch

import fastpipe.ops  # noqa: F401  (registers the ops)
from fastpipe._cache_home import cache_home
from fastpipe._ext import build_info


__all__ = ["conv_engines", "conv_engine_cache", "clear_conv_engine_cache", "use_conv_engine",
           "use_conv_act_backward", "save_conv_engine_choices", "load_conv_engine_choices", "retune"]

log = logging.getLogger(__name__)
_FORMAT = 3  # 2: keys of 30 fields (forward or backward); 3: each line with the choice's margin
_forgotten = set()  # keys retune() forgot: the next save drops them from the file unless chosen again


def conv_engines(device="cpu", backward=False):
    """Names of the engines for a device type's forward calls, or with ``backward=True`` for the
    convolution's backward (the input, weight and bias gradients), eager first (an empty list for a type
    without kernels)."""
    return list(torch.ops.fastpipe._conv_engines(torch.device(device).type, bool(backward)))


def conv_engine_cache():
    """One line per cached key: the call, the engine chosen and each candidate's fastest timed call, then
    in brackets where the choice comes from (timed here, loaded from the cache file, re-timed here), its
    margin over the runner-up and over eager, the spread of its timing, and whether it is thin (re-timed
    by a later run) or wide (saved and used untimed)."""
    return list(torch.ops.fastpipe._conv_engine_cache())


def retune(device="cpu", thin_only=False):
    """Forgets the engine choices of ``device``'s type (with ``thin_only``, those whose margin is thin)
    so that the next call of each key is timed afresh; the cache file drops them at exit unless this run
    chooses them again. Returns how many were forgotten.

    Performance: each forgotten key costs ~150 ms of timing at its next call."""
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device must name a device type such as 'cpu' or 'cuda', got {device!r}: {e}") from None
    if not isinstance(thin_only, bool):
        raise TypeError(f"thin_only must be a bool, got {type(thin_only).__name__}")
    keys = list(torch.ops.fastpipe._conv_engine_forget(kind, thin_only))
    _forgotten.update(keys)
    return len(keys)


def clear_conv_engine_cache():
    """Forget every choice, failure and warning given; the next call of each key is timed again."""
    torch.ops.fastpipe._conv_engine_clear()


@contextlib.contextmanager
def use_conv_engine(name):
    """Forces engine ``name`` ("auto", "eager" or an engine's) for the block, process-wide, as
    FASTPIPE_CONV_ENGINE does for the whole process."""
    old = torch.ops.fastpipe._conv_engine_force(str(name))
    try:
        yield
    finally:
        torch.ops.fastpipe._conv_engine_force(old)


@contextlib.contextmanager
def use_conv_act_backward(name):
    """Runs the CUDA backward's activation gradient and bias gradient with ``name`` for the block,
    process-wide: "aten" (ATen's ops, the default) or "kernel" (fastpipe's one-pass kernel, not yet
    validated on a GPU), as FASTPIPE_CONV_ACT_BACKWARD does for the whole process."""
    old = torch.ops.fastpipe._conv_act_backward_force(str(name))
    try:
        yield
    finally:
        torch.ops.fastpipe._conv_act_backward_force(old)


def _default_cache_path():
    setting = os.environ.get("FASTPIPE_CONV_CACHE")
    if setting is not None:
        return None if setting.strip().lower() in ("", "0", "off", "false", "no") else setting
    return cache_home("conv_engines.json")


def _fingerprint():
    """What a CPU choice depends on besides its key: the CPU, its instruction sets, the libraries."""
    cpu, flags = platform.processor(), ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() == "model name" and cpu in ("", platform.machine()):
                    cpu = value.strip()
                elif name.strip() in ("flags", "Features") and not flags:
                    flags = " ".join(sorted(value.split()))
    except OSError:
        pass
    parts = [cpu, hashlib.sha1(flags.encode()).hexdigest()[:12], f"torch {torch.__version__}",
             f"fastpipe {build_info()['version']}", f"onednn {','.join(torch.ops.fastpipe._conv_onednn_dtypes())}"]
    return " | ".join(parts)


def _read(path):
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        warnings.warn(f"fastpipe: ignoring the conv engine cache {path}: {e}", stacklevel=3)
        return {}
    if isinstance(data, dict) and data.get("format") == 1:
        return {}  # 28-field keys: replaced by this run's choices
    known = isinstance(data, dict) and data.get("format") in (2, _FORMAT)
    if not known or not isinstance(data.get("machines"), dict):
        warnings.warn(f"fastpipe: ignoring the conv engine cache {path}: not a format-2 or {_FORMAT} fastpipe cache",
                      stacklevel=3)
        return {}
    if data["format"] == 2:  # no margin: an empty field, which reads as unknown (thin)
        return {m: [_with_unknown_margin(str(line)) for line in lines] for m, lines in data["machines"].items()}
    return data["machines"]


def _with_unknown_margin(line):
    key, tab, rest = line.partition("\t")
    engine, tab2, report = rest.partition("\t")
    return f"{key}\t{engine}\t\t{report}" if tab and tab2 else line  # else refused by the import


def load_conv_engine_choices(path=None):
    """Adds the CPU engine choices saved in ``path`` (default: ``FASTPIPE_CONV_CACHE``'s file) for this
    machine to the cache; keys already chosen keep their choice. Returns how many were added."""
    path = path or _default_cache_path()
    if path is None:
        return 0
    lines = _read(path).get(_fingerprint(), [])
    try:
        return int(torch.ops.fastpipe._conv_engine_import([str(line) for line in lines]))
    except RuntimeError as e:
        warnings.warn(f"fastpipe: ignoring the conv engine cache {path}: {e}", stacklevel=2)
        return 0


def save_conv_engine_choices(path=None):
    """Merges this process's CPU engine choices into ``path`` (default: ``FASTPIPE_CONV_CACHE``'s file),
    under this machine's fingerprint; concurrent savers (DDP ranks) are serialised by a lock file.
    Returns the path written, or None when there was nothing to save or no cache."""
    path = path or _default_cache_path()
    lines = list(torch.ops.fastpipe._conv_engine_export("cpu"))
    if path is None or not (lines or _forgotten):
        return None
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        machines = _read(path)
        key = _fingerprint()
        merged = {line.split("\t", 1)[0]: line for line in machines.get(key, [])}
        for forgotten in _forgotten:
            merged.pop(forgotten, None)
        # This run's choices win: a saved one was either loaded (then it is the same, or re-timed and merged
        # with it) or made elsewhere.
        merged.update((line.split("\t", 1)[0], line) for line in lines)
        machines[key] = sorted(merged.values())
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".conv_engines.")
        with os.fdopen(fd, "w") as f:
            json.dump({"format": _FORMAT, "machines": machines}, f, indent=0)
        os.replace(tmp, path)
    return path


def _save_at_exit():
    try:
        save_conv_engine_choices()
    except Exception as e:  # noqa: BLE001  (a read-only home must not turn a finished run into a failure)
        log.warning("fastpipe: could not save the conv engine choices: %s", e)


if _default_cache_path() is not None:
    torch.ops.fastpipe._conv_engine_persist("cpu", True)  # for the report: CPU choices are saved at exit
    load_conv_engine_choices()
    atexit.register(_save_at_exit)
