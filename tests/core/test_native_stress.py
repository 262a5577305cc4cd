"""The C++ batch reader, device pipeline and conv tuner's choice cache on their own, under ThreadSanitizer
and AddressSanitizer/UBSan.

ThreadSanitizer cannot run inside CPython, so csrc/core is compiled with tests/core/*_stress.cpp
into a standalone binary. A deliberately broken canary proves each sanitizer is really active.
"""

import concurrent.futures
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORE = sorted(os.path.join(ROOT, "csrc", "core", f) for f in os.listdir(os.path.join(ROOT, "csrc", "core"))
              if f.endswith(".cpp"))
STRESS = {name: os.path.join(ROOT, "tests", "core", f"{name}_stress.cpp") for name in ("reader", "pipeline", "tuner")}
CXX = os.environ.get("CXX", "g++")

pytestmark = pytest.mark.skipif(shutil.which(CXX) is None, reason=f"no C++ compiler ({CXX})")

SANITIZERS = {
    "thread": (["-fsanitize=thread"], "WARNING: ThreadSanitizer: data race",
               "#include <thread>\nint x = 0;\n"
               "int main() { std::thread t([] { x++; }); x++; t.join(); return 0; }\n"),
    "address": (["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"],
                "ERROR: AddressSanitizer: heap-use-after-free",
                "int main(int argc, char**) { int* p = new int[4]; delete[] p; return p[argc]; }\n"),
}


def _compile(source, out, flags):
    cmd = [CXX, "-std=c++17", "-O1", "-g", *flags, "-I", os.path.join(ROOT, "csrc"), "-c", source, "-o", out]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


_CORE_OBJECTS = {}  # sanitizer -> csrc/core's objects, compiled once per run (each program links them)


def _core_objects(tmp_path_factory, sanitizer):
    if sanitizer not in _CORE_OBJECTS:
        out = tmp_path_factory.mktemp(f"core-{sanitizer}")
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            _CORE_OBJECTS[sanitizer] = list(pool.map(
                lambda src: _compile(src, str(out / (os.path.basename(src) + ".o")), SANITIZERS[sanitizer][0]), CORE))
    return _CORE_OBJECTS[sanitizer]


def _build(tmp_path, name, sources, flags, objects=()):
    exe = str(tmp_path / name)
    cmd = [CXX, "-std=c++17", "-O1", "-g", *flags, "-I", os.path.join(ROOT, "csrc"), *sources, *objects, "-o", exe,
           "-lpthread"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return exe


def _run(cmd):
    # ASan must not inherit a preload from the environment; TSan needs no ASLR tricks on this kernel.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    return subprocess.run(cmd if isinstance(cmd, list) else [cmd], capture_output=True, text=True, timeout=120,
                          env=env)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("program", sorted(STRESS))
@pytest.mark.parametrize("sanitizer", sorted(SANITIZERS))
def test_stress_under_sanitizer(tmp_path, tmp_path_factory, sanitizer, program):
    """reader: the batch reader's threads, leases and passes; pipeline: the device pipeline on the
    simulated device (streams with random delays, stream-ordered release, overflow); tuner: the conv
    engine choices selected from forward and backward threads while they are cleared, forgotten,
    imported and exported and graph captures begin and end."""
    flags, canary_report, canary_src = SANITIZERS[sanitizer]
    canary = tmp_path / "canary.cpp"
    canary.write_text(canary_src)
    canary_exe = _build(tmp_path, "canary", [str(canary)], flags)
    # ThreadSanitizer once let the canary's race pass on a loaded machine (empty stderr): a sanitizer that
    # is active reports it in one of three runs.
    reports = [_run(canary_exe).stderr for _ in range(3)]
    assert any(canary_report in e for e in reports), \
        f"the {sanitizer} sanitizer did not catch its canary in 3 runs:\n{reports[-1][-2000:]}"

    exe = _build(tmp_path, "stress", [STRESS[program]], flags, _core_objects(tmp_path_factory, sanitizer))
    r = _run(exe)
    print(r.stdout, r.stderr[-4000:])
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stderr[-4000:]
    assert "Sanitizer" not in r.stderr
    if program == "pipeline":
        # Without the release fence the consumer stream reads refilled slots: wrong bytes, and for
        # ThreadSanitizer a data race (the fence is what orders those accesses).
        r = _run([exe, "canary"])
        assert "CANARY RACED" in r.stdout, r.stdout + r.stderr[-2000:]
        if sanitizer == "thread":
            assert "data race" in r.stderr, r.stderr[-2000:]
