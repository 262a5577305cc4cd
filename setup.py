"""Build script for fastpipe's C++/CUDA extension ``fastpipe._C``.

The extension is compiled against the torch that is already installed (build with
``pip install --no-build-isolation .``): torch's C++ ABI changes between releases, so an extension
built against one torch cannot be loaded by another.

Environment knobs (each decision is printed):
  FASTPIPE_CUDA=auto|0|1   auto: compile CUDA sources when torch is a CUDA build and a CUDA toolkit is
                           found. A GPU is never required to compile.
  FASTPIPE_CUDA_ARCHS      semicolon-separated compute capabilities, default "8.0;9.0".
  CUDA_HOME                toolkit root; found from nvcc (including wrapper scripts) when unset.
  MAX_JOBS                 parallel compile jobs; default from cores and memory.
  FASTPIPE_JPEG=auto|0|1   auto: decode JPEGs (fastpipe.ImageFolder, ImageDataset) when libjpeg's headers
                           and library are found (pkg-config libjpeg, else a test compile).
  FASTPIPE_PNG, FASTPIPE_WEBP  the same for PNG (libspng) and WebP (libwebp) in the reader threads; without
                           them those formats are decoded by Pillow.
  FASTPIPE_CURL=auto|0|1   the same for libcurl: shards read from s3:// and http(s):// URLs; without it those
                           URLs are refused, saying how to build it in.
  DEBUG=1                  -O0 -g (and -lineinfo for CUDA).
  FASTPIPE_LINEINFO=1      an optimised build with line tables (-g, and -lineinfo for CUDA): native stacks
                           and sanitizer reports name files and lines (the GPU check builds so).
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
VERSION = "0.1.0"


def say(msg):
    print(f"[fastpipe setup] {msg}", flush=True)


def _toolkit_root(candidate):
    return candidate if candidate and os.path.isfile(os.path.join(candidate, "include", "cuda_runtime.h")) else None


def find_cuda_home():
    """Locate the CUDA toolkit root (the folder holding bin/nvcc and include/cuda_runtime.h).

    torch's own guess takes the parent of the folder nvcc's link or wrapper lives in (e.g. /usr/local),
    which is wrong when /usr/local/bin/nvcc is a wrapper, so resolve it here first.
    """
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = _toolkit_root(os.environ.get(var))
        if root:
            return root, f"${var}"
    nvcc = shutil.which("nvcc")
    if nvcc:
        real = os.path.realpath(nvcc)
        root = _toolkit_root(os.path.dirname(os.path.dirname(real)))
        if root:
            return root, f"nvcc at {real}"
        try:  # a small shell wrapper such as `exec /usr/local/cuda-13.0/bin/nvcc "$@"`
            with open(real, "r", errors="ignore") as f:
                text = f.read(4096)
            m = re.search(r"(/\S+)/bin/nvcc", text)
            root = _toolkit_root(m.group(1)) if m else None
            if root:
                return root, f"wrapper script {real}"
        except OSError:
            pass
    for cand in ["/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-*"), reverse=True):
        root = _toolkit_root(cand)
        if root:
            return root, "default location"
    return None, "no nvcc on PATH and no toolkit under /usr/local/cuda*"


# The C libraries built in when found: (what, knob, pkg-config package, test program, libraries when
# pkg-config has no entry, Debian package, what happens without it); the knob FASTPIPE_X defines
# FASTPIPE_WITH_X. The image decoders run in the reader threads; libcurl fetches remote shards.
OPTIONAL_LIBRARIES = [
    ("JPEG decoding", "FASTPIPE_JPEG", "libjpeg",
     "#include <stdio.h>\n#include <jpeglib.h>\nint main(void) { struct jpeg_decompress_struct c; "
     "jpeg_crop_scanline(&c, 0, 0); return 0; }\n", ["-ljpeg"], "libjpeg62-turbo-dev (or libjpeg-turbo8-dev)",
     ""),
    ("PNG decoding", "FASTPIPE_PNG", "spng",
     "#include <spng.h>\nint main(void) { spng_ctx* c = spng_ctx_new(0); spng_ctx_free(c); return 0; }\n",
     ["-lspng"], "libspng-dev", "; Pillow decodes them instead"),
    ("WebP decoding", "FASTPIPE_WEBP", "libwebp",
     "#include <webp/decode.h>\nint main(void) { return WebPGetDecoderVersion() > 0 ? 0 : 1; }\n", ["-lwebp"],
     "libwebp-dev", "; Pillow decodes them instead"),
    ("remote shards (s3://, http(s)://)", "FASTPIPE_CURL", "libcurl",
     "#include <curl/curl.h>\nint main(void) { CURLM* m = curl_multi_init(); curl_multi_cleanup(m); return 0; }\n",
     ["-lcurl"], "libcurl4-openssl-dev", "; those URLs are refused"),
]


def find_library(package, program, default_libs, debian):
    """(compile flags, link flags, why) for a C library, or (None, None, why not): pkg-config's flags,
    else the default libraries, confirmed by compiling and linking a test program."""
    try:
        cflags = subprocess.run(["pkg-config", "--cflags", package], capture_output=True, text=True, check=True)
        libs = subprocess.run(["pkg-config", "--libs", package], capture_output=True, text=True, check=True)
        flags = (cflags.stdout.split(), libs.stdout.split(), f"pkg-config {package}")
    except (OSError, subprocess.CalledProcessError):
        flags = ([], default_libs, f"a test compile against {' '.join(default_libs)}")
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None, None, "no C compiler to check for it"
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "t.c")
        with open(src, "w") as f:
            f.write(program)
        r = subprocess.run([cc, src, "-o", os.path.join(tmp, "t")] + flags[0] + flags[1], capture_output=True, text=True)
    if r.returncode != 0:
        return None, None, (f"its headers or library were not found (on Debian/Ubuntu: apt-get install {debian}; "
                            f"`make setup` does it)")
    return flags


CUDA_MODE = os.environ.get("FASTPIPE_CUDA", "auto").strip().lower()
if CUDA_MODE not in ("auto", "0", "1"):
    sys.exit(f"FASTPIPE_CUDA must be auto, 0 or 1, got {CUDA_MODE!r}")

cuda_home, cuda_home_why = find_cuda_home() if CUDA_MODE != "0" else (None, "FASTPIPE_CUDA=0")
if cuda_home:
    # Must be set before torch.utils.cpp_extension is imported: it reads CUDA_HOME at import time.
    os.environ["CUDA_HOME"] = cuda_home

import torch  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension  # noqa: E402

if CUDA_MODE == "0":
    WITH_CUDA, why = False, "FASTPIPE_CUDA=0"
elif torch.version.cuda is None:
    WITH_CUDA, why = False, f"torch {torch.__version__} is a CPU-only build"
elif cuda_home is None:
    WITH_CUDA, why = False, f"no CUDA toolkit found ({cuda_home_why})"
else:
    WITH_CUDA, why = True, f"torch {torch.__version__} is a CUDA {torch.version.cuda} build and the toolkit is {cuda_home} ({cuda_home_why})"
if CUDA_MODE == "1" and not WITH_CUDA:
    sys.exit(f"FASTPIPE_CUDA=1 but CUDA sources cannot be compiled: {why}")
say(f"CUDA kernels: {'ON' if WITH_CUDA else 'OFF'} - {why}")

ARCHS = os.environ.get("FASTPIPE_CUDA_ARCHS", "8.0;9.0").strip()
if WITH_CUDA:
    if not re.fullmatch(r"\d+\.\d+[a-z]?(\+PTX)?(;\d+\.\d+[a-z]?(\+PTX)?)*", ARCHS):
        sys.exit(f"FASTPIPE_CUDA_ARCHS must look like '8.0;9.0', got {ARCHS!r}")
    # torch turns this list into -gencode flags; without it, it probes for a GPU (there may be none).
    os.environ["TORCH_CUDA_ARCH_LIST"] = ARCHS
    say(f"CUDA archs: {ARCHS}")

library_flags = []  # (define, compile flags, link flags) of each library built in
for name, knob, package, program, default_libs, debian, without in OPTIONAL_LIBRARIES:
    mode = os.environ.get(knob, "auto").strip().lower()
    if mode not in ("auto", "0", "1"):
        sys.exit(f"{knob} must be auto, 0 or 1, got {mode!r}")
    cflags, libs, lib_why = find_library(package, program, default_libs, debian) if mode != "0" else (None, None, f"{knob}=0")
    if mode == "1" and cflags is None:
        sys.exit(f"{knob}=1 but {name} cannot be built: {lib_why}")
    say(f"{name}: {'ON' if cflags is not None else 'OFF'} - {lib_why}{'' if cflags is not None else without}")
    if cflags is not None:
        library_flags.append((knob.replace("FASTPIPE_", "FASTPIPE_WITH_"), cflags, libs))

DEBUG = os.environ.get("DEBUG", "0") == "1"
LINEINFO = os.environ.get("FASTPIPE_LINEINFO", "0") == "1" and not DEBUG
if "MAX_JOBS" not in os.environ:
    # A translation unit that includes torch headers needs about 1.5 GB while compiling.
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    os.environ["MAX_JOBS"] = str(max(1, min(os.cpu_count() or 1, int(mem_gb // 1.5))))
# torch (2.12+) runs the compilers through ccache where it is installed (`make system-deps` installs it).
# pip builds an editable install in a new temporary folder each time, which ccache hashes into every -g
# object: leave the folder out, so that a rebuild (another torch, the CPU-only build, a fresh clone of the
# same path) reuses each object whose preprocessed source and flags are unchanged.
os.environ.setdefault("CCACHE_NOHASHDIR", "true")
say(f"compile jobs: {os.environ['MAX_JOBS']}, {'debug' if DEBUG else 'release'} build"
    + (" with line tables (FASTPIPE_LINEINFO=1)" if LINEINFO else ""))


def sources(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))


srcs = sources("csrc/core/*.cpp") + sources("csrc/ops/*.cpp") + sources("csrc/ops/*/*.cpp")
if WITH_CUDA:
    srcs += sources("csrc/cuda/*.cu")
else:
    srcs = [s for s in srcs if not s.startswith(os.path.join("csrc", "ops", "cuda_host", ""))]

defines = [
    ("FASTPIPE_VERSION", f'"{VERSION}"'),
    ("FASTPIPE_TORCH_VERSION", f'"{torch.__version__}"'),
    ("FASTPIPE_CUDA_ARCHS", f'"{ARCHS if WITH_CUDA else ""}"'),
]
opt = ["-O0", "-g"] if DEBUG else ["-O3", "-g"] if LINEINFO else ["-O3"]
# No -std here: torch picks the standard its headers need (C++20 since 2.10); csrc/core is C++17.
# -ffp-contract=off: a * b + c rounded twice, as written (GCC fuses it in functions built for FMA, e.g.
# csrc/core/augment.cpp's, whatever -std says), so the augmentations equal torchvision's and the GPU's.
cxx_flags = ["-Wall", "-Wno-unused-function", "-fvisibility=hidden", "-ffp-contract=off"] + opt
include_dirs = [os.path.join(ROOT, "csrc")]
extra = {"cxx": cxx_flags}
link_flags = []
if torch.backends.openmp.is_available():
    # torch's intra-op threads are an OpenMP team, and at::parallel_for is a header template: compiled
    # without OpenMP it is a serial loop (the loader's num_threads=0, the CPU depthwise model). The
    # extension then needs libgomp.so.1, which resolves to the copy torch already loaded: one team.
    cxx_flags.append("-fopenmp")
    link_flags.append("-fopenmp")
for define, cflags, libs in library_flags:
    defines.append((define, "1"))
    cxx_flags += cflags
    link_flags += libs
if WITH_CUDA:
    defines.append(("FASTPIPE_WITH_CUDA", "1"))
    extra["nvcc"] = ["--expt-relaxed-constexpr", "-Xcompiler", "-fvisibility=hidden"] + (
        ["-O0", "-g", "-lineinfo"] if DEBUG else ["-O3", "--use_fast_math"] + (["-lineinfo"] if LINEINFO else [])
    )
    # pip-installed torch ships CUDA library headers (cuDNN, cuSPARSE, ...) in nvidia-* wheels, not in
    # the toolkit; torch's CUDA headers include them.
    site = os.path.dirname(os.path.dirname(torch.__file__))
    wheel_includes = sorted(glob.glob(os.path.join(site, "nvidia", "*", "include")))
    include_dirs += [os.path.join(cuda_home, "include")] + wheel_includes
    Ext = CUDAExtension
else:
    Ext = CppExtension

say(f"sources: {len(srcs)} ({', '.join(srcs)})")

setup(
    name="fastpipe",
    version=VERSION,
    packages=find_packages(include=["fastpipe", "fastpipe.*"]),
    ext_modules=[
        Ext(
            name="fastpipe._C",
            sources=srcs,
            include_dirs=include_dirs,
            define_macros=defines,
            extra_compile_args=extra,
            extra_link_args=link_flags,
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
