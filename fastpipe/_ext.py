"""Loads the compiled extension fastpipe._C with a message that says how to fix a failed load."""

import torch

try:
    from fastpipe import _C
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"fastpipe's compiled extension could not be loaded ({e}). Build it against the installed torch "
        f"with `pip install --no-build-isolation -e .` (torch {torch.__version__} is installed)."
    ) from e

if _C.BUILD_INFO["torch_version"] != torch.__version__:
    raise ImportError(
        f"fastpipe was built against torch {_C.BUILD_INFO['torch_version']} but torch {torch.__version__} is "
        "installed; torch's C++ ABI differs between releases. Rebuild with `pip install --no-build-isolation -e .`"
    )


def build_info():
    """What this installation was built with and what it can use now.

    Returns
    -------
    dict
        ``version``, ``torch_version`` (built against), ``cuda`` (CUDA kernels compiled),
        ``cuda_archs``, ``cuda_available`` (a GPU is usable now) and ``device`` (its name or None).
    """
    info = dict(_C.BUILD_INFO)
    info["cuda_archs"] = [a for a in info["cuda_archs"].split(";") if a]
    usable = bool(info["cuda"]) and torch.cuda.is_available()
    info["cuda_available"] = usable
    info["device"] = torch.cuda.get_device_name() if usable else None
    return info
