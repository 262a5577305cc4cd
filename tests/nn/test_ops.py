"""The ops behind fastpipe.nn (fastpipe/ops.py): opcheck, gradients, torch.compile, autocast."""

import warnings

import pytest
import torch
import torch.nn as nn

import fastpipe.nn as fnn
from conv_ref import (
    ACT_IDS,
    ACTIVATIONS,
    DEVICES,
    check_error,
    conv_call,
    eager_activation,
    eager_conv_act,
    engines,
    expected_engine,
    grad_from_output,
    make_inputs,
    run_engines,
    to64,
)
from fastpipe.nn import _activations
from fastpipe.nn.functional import conv2d_act

pytestmark = pytest.mark.torch_build

SMALL = (2, 6, 7, 8, 5, 3, 1, 1, 1, 1)  # N, C_in, H, W, C_out, k, stride, padding, dilation, groups
GROUPED = (2, 6, 9, 7, 6, 3, 2, 2, 2, 3)


def op_args(x, w, b, r, conv, act, act_args):
    p = lambda v: [v, v] if isinstance(v, int) else list(v)  # noqa: E731
    return (x, w, b, p(conv["stride"]), p(conv["padding"]), p(conv["dilation"]), conv["groups"], act, act_args, r)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "act,act_kwargs,layout,bias,residual",
    [
        ("relu", {}, "channels_last", True, True),
        ("silu", {}, "nchw", False, False),
        ("gelu", {"approximate": "tanh"}, "channels_last", True, False),
        ("leaky_relu", {"negative_slope": -0.2}, "nchw", True, True),
    ],
)
def test_opcheck(device, act, act_kwargs, layout, bias, residual):
    name, act_args = _activations.resolve(act, act_kwargs)
    x, w, b, r, conv = make_inputs(GROUPED, torch.float32, device, layout, bias=bias, residual=residual)
    for t in (x, w, b, r):
        if t is not None:
            t.requires_grad_()
    args = op_args(x, w, b, r, conv, name, act_args)
    torch.library.opcheck(torch.ops.fastpipe.conv2d_act.default, args)
    torch.library.opcheck(torch.ops.fastpipe._conv2d_act_train.default, args)
    out, preact = torch.ops.fastpipe._conv2d_act_train(*args)
    saved = out if grad_from_output(name, act_args) else preact
    for bias_grad in (True, False):
        torch.library.opcheck(
            torch.ops.fastpipe._conv2d_act_backward.default,
            (torch.randn_like(out), saved.detach(), name, act_args, bias_grad),
        )


@pytest.mark.parametrize("act,act_kwargs", ACTIVATIONS, ids=ACT_IDS)
def test_gradcheck_float64(act, act_kwargs):
    name, act_args = _activations.resolve(act, act_kwargs)
    x, w, b, r, conv = make_inputs(GROUPED, torch.float64, "cpu", "nchw", residual=True)
    inputs = [t.requires_grad_() for t in (x, w, b, r)]
    # Both forward ops: the training op keeps the pre-activation, the plain op recomputes it (or uses
    # its output).
    for op in (torch.ops.fastpipe.conv2d_act, lambda *a: torch.ops.fastpipe._conv2d_act_train(*a)[0]):
        f = lambda x, w, b, r: op(*op_args(x, w, b, r, conv, name, act_args))  # noqa: E731
        assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-5, fast_mode=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("act,act_kwargs", ACTIVATIONS, ids=ACT_IDS)
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_gradients_match_reference(device, act, act_kwargs, layout):
    """Gradients of input, weight, bias and residual at float32 on every engine, error vs error."""
    shape = (2, 10, 9, 9, 12, 3, 1, 1, 1, 2)
    for engine in engines(device):
        x, w, b, r, conv = make_inputs(shape, torch.float32, device, layout, residual=True)
        grad_out = torch.randn(x.shape[0], 12, 9, 9, device=device)

        def grads(x, w, b, r, fn):
            leaves = [t.detach().clone().requires_grad_() for t in (x, w, b, r)]
            out = fn(*leaves)
            out.backward(grad_out.to(out.dtype))
            return out, [t.grad for t in leaves]

        with fnn.use_conv_engine(engine):
            (out, ours), ran = run_engines(lambda: grads(
                x, w, b, r, lambda x, w, b, r: conv2d_act(x, w, b, **conv, activation=act, residual=r, **act_kwargs)))
        want = expected_engine(engine, torch.float32, conv_call(x, w, conv, act))
        assert ran == [want], f"forced {engine}, ran {ran}"
        eager = lambda x, w, b, r: eager_conv_act(x, w, b, **conv, act=act, act_kwargs=act_kwargs, residual=r)  # noqa: E731
        _, torch_own = grads(x, w, b, r, eager)
        _, ref = grads(to64(x), to64(w), to64(b), to64(r), eager)
        fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        assert out.is_contiguous(memory_format=fmt)
        for name, o, t, f in zip(("input", "weight", "bias", "residual"), ours, torch_own, ref, strict=True):
            check_error(f"{engine} grad {name}", o, f, t, torch.float32)


ACT_BACKWARD_KERNEL = "fastpipe::conv_act_backward.kernel"  # the profiler label of the CUDA kernel's runs


def act_backward_ran(fn):
    """(fn's result, whether fastpipe's CUDA activation-backward kernel ran in it)."""
    with torch.autograd.profiler.profile() as prof:
        out = fn()
    return out, any(e.name == ACT_BACKWARD_KERNEL for e in prof.function_events)


def test_the_activation_backward_kernel_is_off_until_validated(fp):
    """The CUDA activation-backward kernel has not run on a GPU yet: ATen's ops are the default; the
    setting (FASTPIPE_CONV_ACT_BACKWARD, use_conv_act_backward) turns it on and refuses other values."""
    assert torch.ops.fastpipe._conv_act_backward_force("aten") == "aten", "the kernel is on by default"
    with fnn.use_conv_act_backward("kernel"):
        assert torch.ops.fastpipe._conv_act_backward_force("kernel") == "kernel"
    assert torch.ops.fastpipe._conv_act_backward_force("aten") == "aten"
    with pytest.raises(RuntimeError, match="the activation backward's setting must be 'aten' or 'kernel', got 'on'"):
        torch.ops.fastpipe._conv_act_backward_force("on")
    code = "import torch, fastpipe.nn; print(torch.ops.fastpipe._conv_act_backward_force('aten'))"
    proc = fp.run_python(code, env={"FASTPIPE_CONV_ACT_BACKWARD": "kernel"})
    assert proc.returncode == 0 and proc.stdout.strip() == "kernel", fp.describe_exit(proc)
    proc = fp.run_python(code, env={"FASTPIPE_CONV_ACT_BACKWARD": "fast"})
    assert proc.returncode != 0 and "FASTPIPE_CONV_ACT_BACKWARD must be 'aten' or 'kernel', got 'fast'" in proc.stderr


@pytest.mark.gpu
def test_a_cuda_training_backward_runs_aten_by_default():
    """Unforced, a CUDA training step's activation backward is ATen's (the kernel is not validated yet)."""
    x, w, b, _, conv = make_inputs(SMALL, torch.float32, "cuda", "nchw")
    x.requires_grad_()
    _, ran = act_backward_ran(lambda: conv2d_act(x, w, b, **conv, activation="silu").sum().backward())
    assert not ran
    with fnn.use_conv_act_backward("kernel"):
        _, ran = act_backward_ran(lambda: conv2d_act(x, w, b, **conv, activation="silu").sum().backward())
    assert ran


# (N, C, H, W) for the backward op: NCHW planes with H*W a multiple of 8 or not; NHWC rows with C a
# multiple of 8 or not; few channels over many rows (many splits of the CUDA bias reduction).
BACKWARD_SHAPES = [(2, 59, 7, 7), (3, 64, 8, 8), (1, 5, 3, 1), (32, 3, 64, 64), (4, 960, 7, 7)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("act,act_kwargs", ACTIVATIONS, ids=ACT_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last], ids=["nchw", "nhwc"])
def test_activation_backward_op(device, act, act_kwargs, dtype, layout):
    """_conv2d_act_backward (on CUDA fastpipe's kernel, enabled for the test and asserted to run; ATen on
    the CPU) against autograd through the eager activation, error vs error, with the bias-gradient
    reduction."""
    name, act_args = _activations.resolve(act, act_kwargs)
    eager = lambda t: eager_activation(t, act, act_kwargs)  # noqa: E731
    for shape in BACKWARD_SHAPES if device == "cuda" else BACKWARD_SHAPES[:3]:
        z = torch.randn(shape, device=device).to(dtype).contiguous(memory_format=layout)
        g = torch.randn(shape, device=device).to(dtype).contiguous(memory_format=layout)
        saved = eager(z) if grad_from_output(name, act_args) else z
        with fnn.use_conv_act_backward("kernel"):
            (grad_in, grad_bias), ran = act_backward_ran(
                lambda: torch.ops.fastpipe._conv2d_act_backward(g, saved, name, act_args, True))
        assert ran == (device == "cuda"), f"the activation-backward kernel ran: {ran}"
        assert grad_in.is_contiguous(memory_format=layout) and grad_bias.dtype == dtype
        # torch's own: autograd through the eager activation at dtype; the reference: the same in float64
        zz = z.detach().requires_grad_()
        eager(zz).backward(g)
        z64 = z.double().requires_grad_()
        eager(z64).backward(g.double())
        check_error(f"grad {shape}", grad_in, z64.grad, zz.grad, dtype)
        check_error(f"bias grad {shape}", grad_bias, z64.grad.sum((0, 2, 3)), zz.grad.float().sum((0, 2, 3)).to(dtype), dtype)
        _, empty = torch.ops.fastpipe._conv2d_act_backward(g, saved, name, act_args, False)
        assert empty.numel() == 0


def test_pre_activation_is_kept_only_when_backward_needs_it():
    """The training op (which also returns the pre-activation) runs only for activations whose
    derivative needs it, and only when a backward will run."""
    x, w, b, _, conv = make_inputs(SMALL, torch.float32, "cpu", "nchw")

    def ops_run(act, x):
        with torch.autograd.profiler.profile() as prof:
            conv2d_act(x, w, b, **conv, activation=act)
        return {e.name for e in prof.function_events}

    xg = x.clone().requires_grad_()
    for act, train in (("relu", False), ("sigmoid", False), ("silu", True), ("hardswish", True)):
        assert ("fastpipe::_conv2d_act_train" in ops_run(act, xg)) == train, act
        assert "fastpipe::_conv2d_act_train" not in ops_run(act, x), act  # nothing requires grad
    with torch.no_grad():
        assert "fastpipe::_conv2d_act_train" not in ops_run("silu", xg)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    """A compiled model of FusedConv2d against the same model in stock modules (eager torch), on each
    engine: forward, input gradient, and the inference graph."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = fnn.FusedConv2d(6, 8, 3, padding=1, activation="silu")
            self.b = fnn.FusedConv2d(8, 8, 3, padding=1, activation=nn.ReLU6())

        def forward(self, x):
            y = self.a(x)
            return self.b(y, residual=y)

    torch._dynamo.reset()
    model = Block().to(device)
    stock_a, stock_b = nn.Conv2d(6, 8, 3, padding=1).to(device), nn.Conv2d(8, 8, 3, padding=1).to(device)
    stock_a.load_state_dict(model.a.state_dict())
    stock_b.load_state_dict(model.b.state_dict())

    def stock(x):
        y = nn.functional.silu(stock_a(x))
        return nn.functional.relu6(stock_b(y) + y)

    x = torch.randn(2, 6, 10, 10, device=device).to(memory_format=torch.channels_last).requires_grad_()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")  # fullgraph: a graph break raises
    ref = stock(x)
    (g_ref,) = torch.autograd.grad(ref.sum(), x)
    y = torch.empty(2, 8, 10, 10, device=device).to(memory_format=torch.channels_last)
    calls = [conv_call(x, model.a.weight, dict(padding=1), "silu"), conv_call(y, model.b.weight, dict(padding=1), "relu6")]
    for engine in engines(device):
        with fnn.use_conv_engine(engine):
            out, ran = run_engines(lambda: compiled(x))
            assert ran == [expected_engine(engine, torch.float32, call) for call in calls], ran
            torch.testing.assert_close(out, ref)
            assert out.is_contiguous(memory_format=torch.channels_last)
            (g,) = torch.autograd.grad(out.sum(), x)
            torch.testing.assert_close(g, g_ref)
            with torch.no_grad():  # the inference graph (conv2d_act rather than the training op)
                torch.testing.assert_close(compiled(x), ref)


@pytest.mark.parametrize(
    "device,dtype",
    [("cpu", torch.bfloat16), pytest.param("cuda", torch.float16, marks=pytest.mark.gpu),
     pytest.param("cuda", torch.bfloat16, marks=pytest.mark.gpu)],
)
def test_autocast(device, dtype):
    """Every engine of the device under autocast (no skip: a gpu-marked case must run on a GPU)."""
    conv = fnn.FusedConv2d(10, 12, 3, padding=1, activation="gelu").to(device)
    ref_conv = nn.Conv2d(10, 12, 3, padding=1).to(device)
    ref_conv.load_state_dict(conv.state_dict())
    x = torch.randn(2, 10, 9, 9, device=device)
    r = torch.randn(2, 12, 9, 9, device=device)
    call = conv_call(x.to(dtype), conv.weight.to(dtype), dict(padding=1), "gelu")
    for engine in engines(device):
        conv.zero_grad()
        with torch.autocast(device, dtype=dtype), fnn.use_conv_engine(engine), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a forced engine that cannot run the dtype here says so
            out, ran = run_engines(lambda: conv(x, residual=r))
            torch_own = nn.functional.gelu(ref_conv(x) + r.to(dtype))
        assert ran == [expected_engine(engine, dtype, call)], (engine, ran)
        assert out.dtype == dtype and torch_own.dtype == dtype
        ref = nn.functional.gelu(nn.functional.conv2d(to64(x.to(dtype)), to64(conv.weight.to(dtype)),
                                                      to64(conv.bias.to(dtype)), padding=1) + to64(r.to(dtype)))
        check_error(f"autocast {engine}", out, ref, torch_own, dtype)
        out.float().sum().backward()
        assert conv.weight.grad.dtype == torch.float32 and conv.bias.grad.dtype == torch.float32


# (shape, layout): a 3x3 NCHW convolution (eager, epilogue, cudnn_fused run it) and a 1x1 channels_last one
# (gemm1x1 too); K = 576 and 64 products per output, where TF32's 10-bit mantissa shows.
TF32_CASES = {"3x3": ((4, 64, 16, 16, 64, 3, 1, 1, 1, 1), "nchw"),
              "1x1": ((4, 64, 16, 16, 64, 1, 1, 0, 1, 1), "channels_last")}
TF32_ENGINES = {"eager", "epilogue", "cudnn_fused", "gemm1x1"}  # cuDNN or cuBLASLt: TF32 where allowed


@pytest.mark.gpu
@pytest.mark.parametrize("case", TF32_CASES)
def test_tf32_setting_is_honoured(case):
    """torch.backends.cudnn.allow_tf32 both ways, on every engine that runs the call (asserted): without
    TF32 float32-accurate; with it, the engines on cuDNN or cuBLASLt use TF32 (their error grows like
    eager's, which shows the setting took effect here) and stay within TF32's error, 2 x cuDNN's own."""
    shape, layout = TF32_CASES[case]
    x, w, b, _, conv = make_inputs(shape, torch.float32, "cuda", layout)
    ref = eager_conv_act(to64(x), to64(w), to64(b), **conv, act="relu", act_kwargs={})
    old = torch.backends.cudnn.allow_tf32
    try:
        errors, ran = {}, {}
        for allow in (False, True):
            torch.backends.cudnn.allow_tf32 = allow
            for engine in engines("cuda"):
                with fnn.use_conv_engine(engine):
                    out, ran[engine] = run_engines(lambda: conv2d_act(x, w, b, **conv, activation="relu"))
                errors[allow, engine] = (out.double() - ref).abs().max().item()
    finally:
        torch.backends.cudnn.allow_tf32 = old
    print({k: f"{v:.2e}" for k, v in errors.items()})
    call = conv_call(x, w, conv, "relu")
    for engine in engines("cuda"):
        assert ran[engine] == [expected_engine(engine, torch.float32, call)], (engine, ran[engine])
    assert errors[True, "eager"] > 10 * errors[False, "eager"], "cuDNN did not use TF32 here: nothing is compared"
    for engine in engines("cuda"):
        assert errors[False, engine] < 1e-4, f"{engine}: float32 without TF32 must be float32-accurate"
        assert errors[True, engine] <= 2 * errors[True, "eager"] + 1e-4, f"{engine}: beyond TF32's error"
        if ran[engine] == [engine] and engine in TF32_ENGINES:
            assert errors[True, engine] > 10 * errors[False, engine], f"{engine} ignores TF32 where allowed"
