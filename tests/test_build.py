"""The package imports everywhere and build_info() describes the build."""

import os
import re
import subprocess
import sys

import pytest
import torch

import fastpipe


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


def test_jpeg_decoding_is_built_where_libjpeg_is_installed():
    """Where the build could find libjpeg-turbo (make installs it: make system-deps), JPEG decoding must be
    in the extension: a missing install step shows here, not as skipped image tests."""
    import shutil
    if shutil.which("pkg-config") is None or subprocess.run(["pkg-config", "--exists", "libjpeg"]).returncode:
        pytest.skip("libjpeg-turbo's development files are not installed here")
    assert fastpipe._ext._C.JPEG["decode"], fastpipe._ext._C.JPEG
    assert fastpipe._ext._C.JPEG["library"].startswith("libjpeg")


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


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip of a machine without a GPU")
@pytest.mark.parametrize("require", ["0", "1"])
def test_gpu_tests_skip_without_a_gpu_unless_a_gpu_is_required(tmp_path, require):
    """The `gpu` marker alone decides (tests/conftest.py): skipped here, an error where the device
    script requires a GPU, so a GPU run cannot pass by skipping everything."""
    tests = os.path.dirname(os.path.abspath(__file__))
    (tmp_path / "conftest.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('suite_conftest', {os.path.join(tests, 'conftest.py')!r})\n"
        "suite = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(suite)\n"
        "pytest_runtest_setup = suite.pytest_runtest_setup\n")
    (tmp_path / "test_marked.py").write_text("import pytest\n\n@pytest.mark.gpu\ndef test_on_gpu():\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "FASTPIPE_REQUIRE_GPU": require})
    if require == "1":
        assert proc.returncode == 1 and "FASTPIPE_REQUIRE_GPU=1 but this test needs a CUDA device" in proc.stdout, proc.stdout
    else:
        assert proc.returncode == 0 and "1 skipped" in proc.stdout and "needs a CUDA device" in proc.stdout, proc.stdout
