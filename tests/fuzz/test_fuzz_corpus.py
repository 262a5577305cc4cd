"""The fuzz harnesses (tests/fuzz/*_fuzz.cpp) replaying their seed corpus, without the fuzzing loop.

Built with libFuzzer, AddressSanitizer and UBSan exactly as tests/fuzz/run.sh builds them; every seed
(valid and defective files, and the reproducers of fixed bugs, named fixed-*) must end cleanly. The
bounded fuzzing itself is `make fuzz`. Needs clang with libFuzzer (Debian: clang-14 libclang-rt-14-dev).
"""

import functools
import os
import re
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# Compiled from ROOT with relative paths, as run.sh does: through ccache, `make fuzz` then reuses the objects.
FLAGS = ["-std=c++17", "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=undefined", "-g", "-O1",
         "-I", "csrc", "-I", "tests/fuzz", "-DFASTPIPE_WITH_JPEG", "-DFASTPIPE_WITH_PNG", "-DFASTPIPE_WITH_WEBP"]
CCACHE = [shutil.which("ccache")] if shutil.which("ccache") else []


def _run_sh_harnesses():
    """harness -> (engine sources it links, its corpus directory), read from run.sh (written once there:
    a source the fuzzers link that was missing here failed every harness's link)."""
    with open(os.path.join(HERE, "run.sh")) as f:
        text = f.read()
    image_path = re.search(r'^IMAGE_PATH="([^"]*)"', text, re.M).group(1)
    sources = {n: v.replace("$IMAGE_PATH", image_path).split()
               for n, v in re.findall(r'\[(\w+)\]="([^"]*)"', text.split("declare -A SOURCES=", 1)[1].split("\n\n")[0])}
    corpora = dict(re.findall(r"\[(\w+)\]=(\w+)", re.search(r"^declare -A CORPUS=\((.*)\)$", text, re.M).group(1)))
    return {name: (sources[name], corpora[name]) for name in corpora}


HARNESSES = _run_sh_harnesses()


def _env(tmp):
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["TMPDIR"] = str(tmp)  # where the harnesses write each input as a file
    return env


@functools.lru_cache(maxsize=None)
def _fuzz_cxx():
    """A clang++ that links -fsanitize=fuzzer,address,undefined, or None."""
    candidates = [os.environ["FUZZ_CXX"]] if os.environ.get("FUZZ_CXX") else ["clang++-14", "clang++"]
    probe = 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }'
    for cxx in candidates:
        if shutil.which(cxx) is None:
            continue
        r = subprocess.run([cxx, "-x", "c++", "-fsanitize=fuzzer,address,undefined", "-", "-o", os.devnull],
                           input=probe, capture_output=True, text=True)
        if r.returncode == 0:
            return cxx
    return None


pytestmark = pytest.mark.skipif(
    _fuzz_cxx() is None,
    reason="no clang++ with libFuzzer (Debian: apt-get install clang-14 libclang-rt-14-dev; FUZZ_CXX overrides)")


@pytest.fixture(scope="module")
def harnesses(tmp_path_factory):
    """The canary and both harnesses, each translation unit compiled once and all in parallel."""
    out = tmp_path_factory.mktemp("fuzz")
    units = {"canary_fuzz": "tests/fuzz/canary_fuzz.cpp"}
    for name, (sources, _) in HARNESSES.items():
        units[name] = f"tests/fuzz/{name}.cpp"
        units.update({s: f"csrc/core/{s}.cpp" for s in sources})
    procs = {u: subprocess.Popen([*CCACHE, _fuzz_cxx(), *FLAGS, "-c", src, "-o", str(out / f"{u}.o")], cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for u, src in units.items()}
    for u, p in procs.items():
        log = p.communicate()[0]
        assert p.returncode == 0, f"compiling {units[u]} failed:\n{log}"
    exes = {}
    for name, sources in [("canary_fuzz", []), *((n, s) for n, (s, _) in HARNESSES.items())]:
        exes[name] = str(out / name)
        subprocess.run([_fuzz_cxx(), *FLAGS, *(str(out / f"{u}.o") for u in [name, *sources]), "-o", exes[name],
                        "-lpthread", "-ljpeg", "-lspng", "-lwebp"], check=True, capture_output=True, text=True)
    return exes


def test_sanitizers_live(harnesses, tmp_path):
    """Replayed inputs run under ASan: the canary's overflowing input is reported, so a clean replay below
    means something."""
    crash = tmp_path / "crash"
    crash.write_bytes(b"FUZZ!")
    r = subprocess.run([harnesses["canary_fuzz"], str(crash)], capture_output=True, text=True, timeout=60,
                       env=_env(tmp_path))
    assert r.returncode != 0 and "ERROR: AddressSanitizer: heap-buffer-overflow" in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_seed_corpus_ends_cleanly(harnesses, tmp_path, name):
    corpus = os.path.join(HERE, "corpus", HARNESSES[name][1])
    seeds = sorted(os.path.join(corpus, f) for f in os.listdir(corpus))
    assert seeds
    r = subprocess.run([harnesses[name], *seeds], capture_output=True, text=True, timeout=120, env=_env(tmp_path))
    assert r.returncode == 0, r.stderr[-4000:]
    assert "Sanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr[-4000:]
    assert r.stderr.count("Executed ") == len(seeds), r.stderr[-4000:]
