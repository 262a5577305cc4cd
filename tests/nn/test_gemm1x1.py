"""The gemm1x1 engine (csrc/kernels/gemm1x1.h): a 1x1 channels_last convolution as one cuBLASLt GEMM with the
residual, bias and ReLU / tanh-GELU in its epilogue. Its plan (operand order, transposes, leading
dimensions, where the bias and residual go, which activations need the epilogue kernel after it) runs on
the host through a model of cuBLASLt's column-major semantics on every build; the engine itself on a GPU
(gpu-marked), forced, against float64 references on awkward channel counts and image sizes."""

import subprocess

import pytest
import torch
import torch.nn.functional as F
from torch._prims_common import suggest_memory_format

import fastpipe
import fastpipe.nn as fnn
from conv_ref import poison_cuda_allocations, run_engines
from fastpipe.nn.functional import conv2d_act

pytestmark = pytest.mark.torch_build

# (batch, in_channels, out_channels, height, width). GEMM m = out_channels, n = batch x pixels, k = in_channels:
# the last four have a dimension of 1 (n, m and k; m, n and k), where cuBLASLt's epilogues may not be used.
SHAPES = [(2, 3, 10, 7, 13), (3, 10, 59, 13, 7), (2, 64, 24, 5, 5),
          (1, 59, 3, 1, 1), (2, 8, 1, 5, 3), (3, 1, 7, 4, 5), (1, 1, 1, 1, 2)]
ACTIVATIONS = [("identity", {}, lambda t: t), ("relu", {}, torch.relu),
               ("gelu", {"approximate": "tanh"}, lambda t: F.gelu(t, approximate="tanh")),
               ("gelu", {}, F.gelu), ("silu", {}, F.silu), ("hardswish", {}, F.hardswish),
               ("leaky_relu", {"negative_slope": 0.1}, lambda t: F.leaky_relu(t, 0.1)),
               ("hardtanh", {"min_val": 0.0, "max_val": 6.0}, lambda t: F.hardtanh(t, 0.0, 6.0))]
ACT_IDS = ["identity", "relu", "gelu_tanh", "gelu", "silu", "hardswish", "leaky_relu", "relu6"]


def inputs(shape, bias, residual, generator, device="cpu"):
    n, c_in, c_out, h, w = shape
    x = torch.randn(n, c_in, h, w, generator=generator, device=device)
    wt = torch.randn(c_out, c_in, 1, 1, generator=generator, device=device)
    b = torch.randn(c_out, generator=generator, device=device) if bias else None
    r = torch.randn(n, c_out, h, w, generator=generator, device=device) if residual else None
    return x, wt, b, r


def reference(x, w, b, r, fn):
    y = F.conv2d(x.double(), w.double(), None if b is None else b.double())
    return fn(y if r is None else y + r.double())


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_the_plan_through_a_model_of_cublaslt(shape, bias, residual):
    g = torch.Generator().manual_seed(sum(shape))
    x, w, b, r = inputs(shape, bias, residual, g)
    for (act, kwargs, fn), name in zip(ACTIVATIONS, ACT_IDS, strict=True):
        act_name, act_args = fnn._activations.resolve(act, kwargs)
        got = torch.ops.fastpipe._gemm1x1_host(x, w, b, r, act_name, act_args)
        want = reference(x, w, b, r, fn)
        assert got.is_contiguous(memory_format=torch.channels_last), name
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("activation,lt_bias,lt_plain", [("relu", "relu_bias", "relu"), ("gelu_tanh", "gelu_bias", "gelu"),
                                                      ("identity", "bias", "default"),
                                                      ("silu", "bias +activation after", "default +activation after")])
def test_the_plan_keeps_cublaslt_epilogues_off_gemms_with_a_dimension_of_1(activation, lt_bias, lt_plain):
    """As torch's addmm (isInputCompliesAddmmCudaLt): cuBLASLt's bias or activation epilogue only where every
    operand has 2 rows and 2 columns or more; otherwise a plain GEMM and the epilogue kernel after it."""
    def plan(batch, spatial, c_in, c_out, bias):
        return torch.ops.fastpipe._gemm1x1_plan(batch, spatial, c_in, c_out, bias, False, activation, [])

    assert plan(2, 9, 8, 16, True) == lt_bias
    assert plan(2, 9, 8, 16, False) == lt_plain
    after = "default" + (" +activation after" if activation != "identity" else "")
    for b, s, c_in, c_out in [(1, 1, 8, 16), (2, 9, 8, 1), (2, 9, 1, 16), (1, 1, 1, 1)]:
        assert plan(b, s, c_in, c_out, False) == after, (b, s, c_in, c_out)
        with_bias = "default +bias after" + (" +activation after" if activation != "identity" else "")
        assert plan(b, s, c_in, c_out, True) == with_bias, (b, s, c_in, c_out)


@pytest.mark.skipif(not fastpipe.build_info()["cuda"], reason="built without CUDA kernels")
def test_cublaslt_is_taken_only_from_the_copy_torch_loaded(tmp_path):
    """The engine passes torch's cuBLASLt handle: a library that this process has not loaded is declined with
    the reason, never loaded (a second copy would not own that handle); torch's own copy is used."""
    src = tmp_path / "lt.c"
    src.write_text("int cublasLtMatmul(void) { return 0; }\n")
    lib = tmp_path / "libnot_loaded_lt.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    why = torch.ops.fastpipe._gemm1x1_cublaslt_lookup(str(lib))
    with open("/proc/self/maps") as f:
        loaded = str(lib) in f.read()
    assert not loaded, "the lookup loaded a library torch had not loaded"
    assert why.startswith(f"{lib} is not loaded in this process") and "torch's cuBLASLt handle" in why, why
    major = torch.version.cuda.split(".")[0]
    assert torch.ops.fastpipe._gemm1x1_cublaslt_lookup(f"libcublasLt.so.{major}") == ""


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_the_engine_on_a_gpu(shape, dtype, residual):
    """Forced (not validated yet), every activation, outputs poisoned first; the engine must really run."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x, w, b, r = inputs(shape, True, residual, g, "cuda")
    cl = torch.channels_last
    # NHWC strides even where a dimension of 1 makes the layout ambiguous: contiguous(memory_format=cl)
    # and permute().contiguous() keep such a tensor's NCHW strides, and the op then computes in NCHW, as
    # eager does (the H200 run saw gemm1x1 decline them).
    def nhwc(t):
        return torch.empty(t.permute(0, 2, 3, 1).shape, dtype=dtype, device=t.device).permute(0, 3, 1, 2).copy_(t)

    x, r = nhwc(x), None if r is None else nhwc(r)
    w, b = w.to(dtype), b.to(dtype)
    tol = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
    assert suggest_memory_format(x) == cl and (r is None or suggest_memory_format(r) == cl)
    for (act, kwargs, fn), name in zip(ACTIVATIONS, ACT_IDS, strict=True):
        poison_cuda_allocations((shape[0], shape[2], shape[3], shape[4]), dtype=dtype)
        with fnn.use_conv_engine("gemm1x1"):
            got, ran = run_engines(lambda: conv2d_act(x, w, b, activation=act, residual=r, **kwargs))
        torch.cuda.synchronize()
        assert ran == ["gemm1x1"], (name, ran)
        want = reference(x, w, b, r, fn)
        assert got.is_contiguous(memory_format=cl), name
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * max(1.0, want.abs().max().item()),
                                   msg=lambda m: f"{name}: {m}")


@pytest.mark.gpu
def test_the_engine_declines_what_it_does_not_compute():
    """NCHW, 3x3, stride 2 and groups fall back to eager when gemm1x1 is forced (with the reason)."""
    x = torch.randn(2, 8, 9, 9, device="cuda")
    cases = [(x, torch.randn(8, 8, 1, 1, device="cuda"), {}),  # NCHW
             (x.contiguous(memory_format=torch.channels_last), torch.randn(8, 8, 3, 3, device="cuda"), {}),
             (x.contiguous(memory_format=torch.channels_last), torch.randn(8, 8, 1, 1, device="cuda"), {"stride": 2}),
             (x.contiguous(memory_format=torch.channels_last), torch.randn(8, 4, 1, 1, device="cuda"), {"groups": 2})]
    for xi, wi, kw in cases:
        with fnn.use_conv_engine("gemm1x1"):
            _, ran = run_engines(lambda: conv2d_act(xi, wi, activation="relu", **kw))
        assert ran == ["eager"], (kw, wi.shape, ran)
