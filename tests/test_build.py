"""The package imports everywhere and build_info() describes the build."""

import os
import re
import subprocess
import sys

import pytest
import torch

import fastpipe

pytestmark = pytest.mark.torch_build


def test_build_info_keys_and_types():
    info = fastpipe.build_info()
    print(info)
    assert isinstance(info, dict)
    expected = {
        "version": str,
        "torch_version": str,
        "cuda": bool,
        "cuda_archs": list,
        "cuda_available": bool,
    }
    for key, typ in expected.items():
        assert key in info, f"build_info() lacks {key!r}: {sorted(info)}"
        assert isinstance(info[key], typ), f"build_info()[{key!r}] = {info[key]!r} is not {typ.__name__}"
    assert "device" in info
    assert info["device"] is None or isinstance(info["device"], str)


def test_build_info_values_consistent():
    info = fastpipe.build_info()
    assert info["version"] == fastpipe.__version__
    assert info["torch_version"] == torch.__version__, "built against a different torch than the one installed"
    for arch in info["cuda_archs"]:
        assert isinstance(arch, str) and re.fullmatch(r"\d+\.\d+a?", arch), f"odd CUDA arch {arch!r}"
    if info["cuda"]:
        assert info["cuda_archs"], "CUDA kernels compiled but no arch listed"
    else:
        assert info["cuda_available"] is False, "no CUDA kernels compiled, yet a GPU is reported usable"
    assert info["cuda_available"] == (info["cuda"] and torch.cuda.is_available())
    if info["cuda_available"]:
        assert info["device"]
    else:
        assert info["device"] is None


@pytest.mark.parametrize("fmt,package,library", [("JPEG", "libjpeg", "libjpeg"), ("PNG", "spng", "libspng"),
                                                  ("WEBP", "libwebp", "libwebp")])
def test_image_decoding_is_built_where_its_library_is_installed(fmt, package, library):
    """Where the build could find a decoder's library (make installs them: make system-deps), it must be in
    the extension: a missing install step shows here, not as images silently decoded by Pillow."""
    import shutil
    if shutil.which("pkg-config") is None or subprocess.run(["pkg-config", "--exists", package]).returncode:
        pytest.skip(f"{package}'s development files are not installed here")
    decoder = getattr(fastpipe._ext._C, fmt)
    assert decoder["decode"] and decoder["library"].startswith(library), decoder


def test_build_info_is_json_serialisable():
    import json

    info = fastpipe.build_info()
    assert json.loads(json.dumps(info)) == info
    assert set(info) == {"version", "torch_version", "cuda", "cuda_archs", "cuda_available", "device"}


def test_build_info_returns_a_fresh_dict():
    a = fastpipe.build_info()
    a["version"] = "tampered"
    assert fastpipe.build_info()["version"] == fastpipe.__version__


def test_data_api_is_exported():
    import fastpipe.data

    for name in ("Loader", "NpyDataset", "TokenDataset", "write_npy"):
        assert hasattr(fastpipe, name), f"fastpipe.{name} missing"
        assert getattr(fastpipe, name) is getattr(fastpipe.data, name), f"fastpipe.{name} is not fastpipe.data.{name}"


@pytest.mark.timeout(120)
def test_import_without_gpu_in_fresh_process():
    """`import fastpipe` never fails for lack of a GPU (CUDA hidden from the process)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    code = (
        "import fastpipe, json; info = fastpipe.build_info(); "
        "assert info['cuda_available'] is False, info; "
        "print(json.dumps(info))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100, env=env)
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"


# Every way a test may be skipped for lack of a GPU: (file, content); then the skips that stay skips under
# FASTPIPE_REQUIRE_GPU=1: a CPU test's, a module without gpu tests, a missing optional package (not a package
# the GPU run needs, such as torchvision, whether a test or its module imports it).
SKIP_STYLES = {
    "test_marked.py": "import pytest\n\n@pytest.mark.gpu\ndef test_on_gpu():\n    pass\n",
    "test_module_skipif.py": ("import pytest\n\npytestmark = [pytest.mark.gpu, pytest.mark.skipif(True, reason='no GPU "
                              "here')]\n\ndef test_module_marked():\n    pass\n"),
    "test_param_skipif.py": ("import pytest\n\n@pytest.mark.parametrize('device', [pytest.param('cuda', marks=["
                             "pytest.mark.gpu, pytest.mark.skipif(True, reason='no GPU here')])])\n"
                             "def test_param(device):\n    pass\n"),
    "test_skip_inside.py": ("import pytest\n\n@pytest.mark.gpu\ndef test_skips_itself():\n"
                            "    pytest.skip('no GPU here')\n"),
    "test_module_skipped.py": ("import pytest\n\npytest.skip('no GPU here', allow_module_level=True)\n\n"
                               "@pytest.mark.gpu\ndef test_never_collected():\n    pass\n"),
    "test_cpu.py": "import pytest\n\ndef test_cpu_skip():\n    pytest.skip('a CPU test may skip')\n",
    "test_cpu_module_skipped.py": ("import pytest\n\npytest.skip('a module without gpu tests may skip', "
                                   "allow_module_level=True)\n\ndef test_cpu():\n    pass\n"),
    "test_optional_package.py": ("import pytest\n\n@pytest.mark.gpu\ndef test_needs_a_package():\n"
                                 "    pytest.importorskip('fastpipe_optional_package')\n"),
    "test_required_package.py": ("import pytest\n\n@pytest.mark.gpu\ndef test_needs_torchvision():\n"
                                 "    pytest.importorskip('fastpipe_required_package')\n"),
    "test_module_import_skipped.py": ("import pytest\n\npytest.importorskip('fastpipe_required_package')\n\n"
                                      "@pytest.mark.gpu\ndef test_never_collected():\n    pass\n"),
}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip of a machine without a GPU")
@pytest.mark.parametrize("require,gpu", [("0", False), ("1", False), ("1", True)],
                         ids=["skip", "required", "required-broken-setup"])
def test_gpu_tests_skip_without_a_gpu_unless_a_gpu_is_required(tmp_path, require, gpu):
    """tests/conftest.py: here every gpu test skips; where the device script requires a GPU, every skip of
    a gpu test is a failure however the skip is written (the gpu marker; a skipif on the module or a
    parameter, which runs before the marker's hook; a skip inside the test; pytest.importorskip of a package
    the run needs, in the test or its module; a module skipped whole fails the run), so a GPU run cannot
    pass by skipping. `gpu`: the marker's own check passes, as on a GPU machine whose tests skip for
    another reason (a broken setup). A CPU test's skip stays a skip, and so does a gpu test's
    pytest.importorskip of an optional package (OPTIONAL_ON_GPU: CuPy is not a GPU setup)."""
    tests = os.path.dirname(os.path.abspath(__file__))
    (tmp_path / "conftest.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('suite_conftest', {os.path.join(tests, 'conftest.py')!r})\n"
        "suite = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(suite)\n"
        + ("suite._gpu_missing = lambda: None\n" if gpu else "")
        + "suite.OPTIONAL_ON_GPU = {'fastpipe_optional_package'}\n"
        + "".join(f"{hook} = suite.{hook}\n" for hook in ("pytest_runtest_setup", "pytest_runtest_makereport",
                                                          "pytest_make_collect_report", "pytest_terminal_summary",
                                                          "pytest_sessionfinish")))
    for name, content in SKIP_STYLES.items():
        (tmp_path / name).write_text(content)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "-o", "addopts=",
                           "-W", "ignore::pytest.PytestUnknownMarkWarning", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "FASTPIPE_REQUIRE_GPU": require})
    out = proc.stdout
    if require == "0":
        assert proc.returncode == 0 and "10 skipped" in out and "needs a CUDA device" in out, out
        return
    assert proc.returncode == 1, out
    failed = {"test_module_skipif.py::test_module_marked": "this gpu test was skipped: Skipped: no GPU here",
              "test_param_skipif.py::test_param[cuda]": "this gpu test was skipped: Skipped: no GPU here",
              "test_skip_inside.py::test_skips_itself": ("this gpu test was skipped: Skipped: no GPU here" if gpu
                                                         else "this test needs a CUDA device"),
              "test_required_package.py::test_needs_torchvision": (
                  "this gpu test was skipped: Skipped: could not import 'fastpipe_required_package'" if gpu
                  else "this test needs a CUDA device")}
    if gpu:
        assert re.search(r"^PASSED test_marked.py::test_on_gpu$", out, re.M), out
    else:
        failed["test_marked.py::test_on_gpu"] = "this test needs a CUDA device"
    for test, why in failed.items():
        assert re.search(rf"^(FAILED|ERROR) {re.escape(test)} ", out, re.M), f"{test} not failed:\n{out}"
        assert f"FASTPIPE_REQUIRE_GPU=1 but {why}" in out, out
    assert "FASTPIPE_REQUIRE_GPU=1 but test_module_skipped.py was skipped whole: Skipped: no GPU here" in out, out
    assert ("FASTPIPE_REQUIRE_GPU=1 but test_module_import_skipped.py was skipped whole: Skipped: could not import "
            "'fastpipe_required_package'") in out, out
    assert re.search(r"^SKIPPED \[1\] test_cpu.py:\d+: a CPU test may skip$", out, re.M), out
    assert re.search(r"^SKIPPED \[1\] test_cpu_module_skipped.py:\d+: a module without gpu tests may skip$", out,
                     re.M), out
    assert "test_cpu_module_skipped.py was skipped whole" not in out, out
    if gpu:
        assert re.search(r"^SKIPPED \[1\] test_optional_package.py:\d+: could not import", out, re.M), out
