"""fuse() on hand-built torchvision-style blocks (ResNet basic/bottleneck, MobileNetV2) and edge cases."""

import copy
import io

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fastpipe.nn as fnn
from conv_ref import ACT_IDS, ACTIVATIONS, DEVICES, check_error, eager_activation, run_engines

pytestmark = pytest.mark.torch_build


class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class Bottleneck(nn.Module):
    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != planes * 4:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes * 4, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes * 4))

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ConvBNReLU(nn.Sequential):
    def __init__(self, inp, oup, kernel=3, stride=1, groups=1):
        super().__init__(nn.Conv2d(inp, oup, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(oup), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    def __init__(self, inp, oup, stride, expand_ratio):
        super().__init__()
        hidden = inp * expand_ratio
        self.use_res_connect = stride == 1 and inp == oup
        layers = [] if expand_ratio == 1 else [ConvBNReLU(inp, hidden, kernel=1)]
        layers += [ConvBNReLU(hidden, hidden, stride=stride, groups=hidden), nn.Conv2d(hidden, oup, 1, bias=False),
                   nn.BatchNorm2d(oup)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


def randomize(model, seed=0):
    """Non-trivial batch-norm statistics and affine parameters, then eval mode."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(0.2 * torch.randn(m.num_features, generator=g))
            m.running_var.copy_(0.5 + torch.rand(m.num_features, generator=g))
            m.weight.data.copy_(1 + 0.3 * torch.randn(m.num_features, generator=g))
            m.bias.data.copy_(0.2 * torch.randn(m.num_features, generator=g))
    return model.eval()


def check_equivalent(model, x, expect_fused, convs_left=0):
    """fuse(model) computes what model computes (error vs error against the float64 model), fuses the
    expected number of chains and leaves no batch norm; returns the fused model."""
    fused = fnn.fuse(model)
    print(fused.fuse_report)
    assert len(fused.fuse_report.fused) == expect_fused, str(fused.fuse_report)
    kinds = [type(m) for m in fused.modules()]
    assert sum(isinstance(m, fnn.FusedConv2d) for m in fused.modules()) == expect_fused
    assert nn.BatchNorm2d not in kinds and kinds.count(nn.Conv2d) == convs_left
    with torch.no_grad():
        ours, torch_own = fused(x), model(x)
        ref = copy.deepcopy(model).double()(x.double())
    assert ours.is_contiguous(memory_format=torch.channels_last) == torch_own.is_contiguous(memory_format=torch.channels_last)
    check_error("fused model", ours, ref, torch_own, x.dtype)
    return fused


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last], ids=["nchw", "channels_last"])
@pytest.mark.parametrize(
    "block,expect",
    [
        (lambda: BasicBlock(16, 16), 2),
        (lambda: BasicBlock(16, 32, stride=2), 3),
        (lambda: Bottleneck(32, 8), 3),
        (lambda: Bottleneck(16, 8, stride=2), 4),
        (lambda: InvertedResidual(16, 16, 1, 6), 3),
        (lambda: InvertedResidual(16, 24, 2, 6), 3),
        (lambda: InvertedResidual(16, 16, 1, 1), 2),
    ],
    ids=["basic", "basic-down", "bottleneck", "bottleneck-down", "mbv2-res", "mbv2-s2", "mbv2-t1"],
)
def test_fuse_blocks(device, layout, block, expect):
    torch.manual_seed(0)
    model = randomize(block()).to(device, memory_format=layout)
    x = torch.randn(2, 16 if not isinstance(model, Bottleneck) or model.conv1.in_channels == 16 else 32, 12, 12,
                    device=device).to(memory_format=layout)
    check_equivalent(model, x, expect)


def test_report_and_names():
    model = randomize(nn.Sequential(BasicBlock(8, 16, stride=2), BasicBlock(16, 16)))
    fused = fnn.fuse(model)
    names = [str(c) for c in fused.fuse_report.fused]
    assert "0.conv2 + 0.bn2 + add + relu -> 0.conv2" in names, names
    assert "0.downsample.0 + 0.downsample.1 + identity -> 0.downsample.0" in names, names
    assert "0.conv1.weight" in fused.state_dict() and not any("bn" in k for k in fused.state_dict())
    assert "fused 5 chain(s)" in str(fused.fuse_report)
    # the original is untouched
    assert isinstance(model[0].bn1, nn.BatchNorm2d)


def test_training_batchnorm_is_left_alone():
    model = BasicBlock(8, 8).train()
    fused = fnn.fuse(model)
    assert fused.fuse_report.fused == []
    reasons = dict(fused.fuse_report.skipped)
    assert reasons["conv1"] == "bn1 is a BatchNorm2d in training mode"
    assert sum(isinstance(m, nn.BatchNorm2d) for m in fused.modules()) == 2


class Shapes(nn.Module):
    """Chains fuse() must stop short of or leave alone, and activation spellings it must recognise."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d, self.e = (nn.Conv2d(4, 4, 3, padding=1) for _ in range(5))
        self.bn = nn.BatchNorm2d(4)
        self.shared = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        y = self.bn(self.a(x))
        y = F.relu(y) + y  # bn output has two users: conv + bn fuse, the relu stays
        z = self.b(y)
        z = z.sigmoid() + z  # conv output has two users: left alone
        w = F.leaky_relu(self.c(z), 0.2)
        w = F.gelu(self.d(w), approximate="tanh")
        w = F.hardtanh(self.e(w), -1.0, 2.0)
        return torch.tanh(self.shared(w)) + self.shared(x).relu()


def test_multi_user_intermediates_shared_modules_and_spellings():
    torch.manual_seed(0)
    model = randomize(Shapes())
    x = torch.randn(2, 4, 6, 6)
    fused = check_equivalent(model, x, 6, convs_left=1)
    report = {str(c) for c in fused.fuse_report.fused}
    assert {"a + bn + identity -> a", "c + leaky_relu(0.2) -> c", "d + gelu_tanh -> d",
            "e + hardtanh(-1.0, 2.0) -> e"} <= report, report
    assert {"shared + tanh -> shared_fused_4", "shared + relu -> shared_fused_5"} <= report, report
    assert dict(fused.fuse_report.skipped)["b"] == "its output has 2 users"


class Untraceable(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.SiLU())

    def forward(self, x):
        return self.body(x) if x.sum() > 0 else -self.body(x)  # data-dependent: fx cannot trace it


def test_untraceable_module_is_fused_inside():
    model = randomize(Untraceable())
    x = torch.rand(1, 3, 5, 5)
    fused = fnn.fuse(model)
    assert isinstance(fused, Untraceable) and isinstance(fused.body.get_submodule("0"), fnn.FusedConv2d)
    assert "not traceable" in dict(fused.fuse_report.skipped)["Untraceable"]
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x))


def test_inplace_shares_parameters():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.GELU()).eval()
    assert fnn.fuse(model, inplace=True).get_submodule("0").weight is model[0].weight
    assert fnn.fuse(model).get_submodule("0").weight is not model[0].weight


# ---- edge cases: every fused model must compute what the original computes --------------------------------
def check_same(model, *inputs, fused=None):
    """fuse(model) (or ``fused``) against the original eager model, both against the float64 model (error
    vs error); inputs an in-place op of the model writes into must change alike. Returns the fused model."""
    fused = fnn.fuse(model) if fused is None else fused
    print(fused.fuse_report)
    dtype = inputs[0].dtype
    ours_in, own_in = [t.clone() for t in inputs], [t.clone() for t in inputs]
    ref_in = [t.to(torch.float64, copy=True) if t.is_floating_point() else t.clone() for t in inputs]
    with torch.no_grad():
        ours, torch_own = fused(*ours_in), model(*own_in)
        ref = copy.deepcopy(model).double()(*ref_in)
    assert ours.dtype == torch_own.dtype and ours.shape == torch_own.shape, (ours.dtype, ours.shape, torch_own.shape)
    check_error("fused model", ours, ref, torch_own, dtype)
    for k, (a, b, r) in enumerate(zip(ours_in, own_in, ref_in, strict=True)):
        check_error(f"input {k} after the call", a, r, b, dtype)
    return fused


def randomize_any(model, seed=0):
    """Like randomize, for batch norms without affine parameters or running statistics too."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            if m.running_mean is not None:
                m.running_mean.copy_(0.2 * torch.randn(m.num_features, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.num_features, generator=g))
            if m.affine:
                m.weight.data.copy_(1 + 0.3 * torch.randn(m.num_features, generator=g))
                m.bias.data.copy_(0.2 * torch.randn(m.num_features, generator=g))
    return model.eval()


def fused_names(fused):
    return {str(c) for c in fused.fuse_report.fused}


class ScaledConv(nn.Conv2d):
    """A Conv2d subclass taking an extra argument: its forward is not nn.Conv2d's."""

    def forward(self, x, scale=1.0):
        return super().forward(x) * scale


class OffsetConv(nn.Conv2d):
    def forward(self, x):
        return super().forward(x) + 0.75


class ExtraArgs(nn.Module):
    def __init__(self):
        super().__init__()
        self.scaled = ScaledConv(3, 10, 3, padding=1)
        self.offset = OffsetConv(10, 10, 1)
        self.bn = nn.BatchNorm2d(10)
        self.plain = nn.Conv2d(10, 10, 3, padding=1, bias=False)

    def forward(self, x):
        y = F.relu(self.scaled(x, 2.5))
        y = torch.sigmoid(self.bn(self.offset(y)))
        return torch.tanh(self.plain(input=y))


def test_conv_with_extra_arguments_or_subclass_is_not_fused():
    torch.manual_seed(1)
    model = randomize_any(ExtraArgs())
    fused = check_same(model, torch.randn(2, 3, 7, 9))
    assert fused.fuse_report.fused == [], str(fused.fuse_report)
    assert not any(isinstance(m, fnn.FusedConv2d) for m in fused.modules())
    # fx traces through a subclass defined outside torch.nn (its F.conv2d is left as it is); a call with a
    # keyword is left with the reason
    assert dict(fused.fuse_report.skipped) == {"plain": "called with more than the input"}, str(fused.fuse_report)
    assert isinstance(fused.bn, nn.BatchNorm2d)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bn_kwargs,folded", [({"affine": False}, True), ({"track_running_stats": False}, False),
                                             ({"affine": False, "track_running_stats": False}, False)],
                         ids=["no-affine", "no-running-stats", "neither"])
def test_batchnorm_without_affine_or_running_stats(device, bn_kwargs, folded):
    torch.manual_seed(2)
    model = randomize_any(nn.Sequential(nn.Conv2d(3, 10, 3, stride=2, padding=1), nn.BatchNorm2d(10, **bn_kwargs),
                                        nn.ReLU(), nn.Conv2d(10, 59, 1, bias=False), nn.BatchNorm2d(59, **bn_kwargs),
                                        nn.Hardswish())).to(device)
    x = 3 * torch.randn(3, 3, 11, 7, device=device) + 1  # batch statistics far from the running ones
    fused = check_same(model, x)
    if folded:
        assert fused_names(fused) == {"0 + 1 + relu -> 0", "3 + 4 + hardswish -> 3"}, str(fused.fuse_report)
        assert not any(isinstance(m, nn.BatchNorm2d) for m in fused.modules())
    else:
        assert fused.fuse_report.fused == []
        reasons = dict(fused.fuse_report.skipped)
        assert "track_running_stats=False" in reasons["0"] and "track_running_stats=False" in reasons["3"], reasons
        assert sum(isinstance(m, nn.BatchNorm2d) for m in fused.modules()) == 2


class Unfusable(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Conv2d(10, 10, 3, padding=1) for _ in range(4))
        self.bn = nn.BatchNorm2d(10)
        self.elu, self.mish, self.prelu = nn.ELU(0.7), nn.Mish(), nn.PReLU(10, 0.3)

    def forward(self, x):
        y = self.elu(self.bn(self.a(x)))
        y = self.mish(self.b(y))
        y = F.softplus(self.c(y), beta=2.0)
        y = self.prelu(self.d(y))
        return F.leaky_relu(y, 0.05)


def test_activations_it_cannot_fuse_stay_in_place():
    torch.manual_seed(3)
    model = randomize_any(Unfusable())
    fused = check_same(model, torch.randn(2, 10, 5, 6))
    assert fused_names(fused) == {"a + bn + identity -> a"}, str(fused.fuse_report)
    kinds = {type(m) for m in fused.modules()}
    assert {nn.ELU, nn.Mish, nn.PReLU} <= kinds
    assert any(n.target is F.softplus for n in fused.graph.nodes)
    assert dict(fused.fuse_report.skipped)["b"] == "no batch norm, activation or add follows"


class Adds(nn.Module):
    """Residual adds fuse() must fuse exactly, or leave alone."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.conv = nn.Conv2d(10, 10, 3, padding=1)
        self.other = nn.Conv2d(10, 10, 1)
        self.bn = nn.BatchNorm2d(10)

    def forward(self, x):
        c = self.bn(self.conv(x))
        y = self.other(x)
        how = self.how
        if how == "y += c":
            y += c
            return F.relu(y)
        if how == "c += y":
            c += y
            return F.relu(c)
        if how == "x += c":  # writes into the caller's tensor
            x += c
            return torch.sigmoid(x)
        if how == "c.add_(y)":
            return c.add_(y).relu()
        if how == "y.add_(c)":
            return y.add_(c).relu()
        if how == "torch.add alpha":
            return F.relu(torch.add(c, y, alpha=2))
        if how == "torch.add alpha, conv second":
            return F.relu(torch.add(y, c, alpha=-0.5))
        if how == "method add alpha":
            return F.relu(c.add(y, alpha=3.0))
        if how == "add_ alpha":
            return F.relu(c.add_(y, alpha=0.25))
        if how == "method add":
            return F.relu(y.add(c))
        if how == "c + c":
            return F.relu(c + c)
        if how == "c - y":
            return F.relu(c - y)
        raise AssertionError(how)


ADD_CASES = {  # how -> is the add fused as a residual?
    "y += c": False, "c += y": True, "x += c": False, "c.add_(y)": True, "y.add_(c)": False,
    "torch.add alpha": False, "torch.add alpha, conv second": False, "method add alpha": False, "add_ alpha": False,
    "method add": True, "c + c": False, "c - y": False,
}


@pytest.mark.parametrize("how", list(ADD_CASES))
def test_adds_in_place_and_with_alpha(how):
    torch.manual_seed(4)
    model = randomize_any(Adds(how))
    fused = check_same(model, torch.randn(2, 10, 7, 5))
    residual = [c.residual for c in fused.fuse_report.fused if c.conv == "conv"]
    assert len(residual) == 1, str(fused.fuse_report)  # conv + bn always fold
    assert residual[0] is ADD_CASES[how], str(fused.fuse_report)


class OddResiduals(nn.Module):
    """Adds whose other operand the fused op cannot take as it is: larger after broadcasting (a global
    context block), another dtype, a Python number, a 0-d tensor, a broadcast parameter."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.conv = nn.Conv2d(10, 10, 1)
        self.pos = nn.Parameter(torch.randn(10, 1, 7))

    def forward(self, x, r):
        if self.how == "context":
            return x + self.conv(x.mean((2, 3), keepdim=True))
        if self.how == "context in place":
            c = self.conv(x.mean((2, 3), keepdim=True))
            c += x[:, :, :1, :1]
            return F.gelu(c)
        if self.how == "float64":
            return F.relu(self.conv(x) + r)
        if self.how == "float64 in place":
            c = self.conv(x)
            c += r
            return F.relu(c)
        if self.how == "number":
            return torch.tanh(self.conv(x) + x.shape[0])
        if self.how == "0-d":
            return F.silu(self.conv(x) + r.sum())
        if self.how == "param":
            return F.hardtanh(self.conv(x) + self.pos, -0.5, 0.5)
        raise AssertionError(self.how)


@pytest.mark.parametrize("how", ["context", "context in place", "float64", "float64 in place", "number", "0-d",
                                 "param"])
def test_residuals_that_broadcast_promote_or_are_numbers(how):
    torch.manual_seed(5)
    model = OddResiduals(how).eval()
    x = torch.randn(3, 10, 6, 7)
    r = torch.randn(3, 10, 6, 7, dtype=torch.float64 if "float64" in how else torch.float32)
    fused = check_same(model, x, r)
    assert [c.residual for c in fused.fuse_report.fused] == [True], str(fused.fuse_report)


class Grow(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(10, 10, 1)

    def forward(self, x):
        c = self.conv(x.mean((2, 3), keepdim=True))
        c += x
        return F.relu(c)


def test_in_place_add_that_would_grow_the_output_raises_as_in_eager():
    model = Grow().eval()
    fused = fnn.fuse(model)
    assert [c.residual for c in fused.fuse_report.fused] == [True], str(fused.fuse_report)
    x = torch.randn(2, 10, 3, 5)
    for m in (model, fused):
        with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
            m(x)


@pytest.mark.parametrize("act,act_kwargs", ACTIVATIONS, ids=ACT_IDS)
@pytest.mark.parametrize("path", ["fused op", "eager fallback"])
def test_residual_with_every_activation(act, act_kwargs, path):
    """FusedConv2dAdd runs the fused op when the residual fits and eager PyTorch when it does not: both
    compute act(conv + residual) for every activation."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(5, 10, 3, padding=1)

        def forward(self, x, r):
            return eager_activation(self.conv(x) + r, act, act_kwargs)

    torch.manual_seed(6)
    model = Block().eval()
    x = torch.randn(2, 5, 6, 9)
    r = torch.randn(2, 10, 6, 9) if path == "fused op" else torch.randn(2, 1, 10, 6, 9)  # the latter enlarges
    fused = check_same(model, x, r)
    assert len(fused.fuse_report.fused) == 1 and fused.fuse_report.fused[0].residual, str(fused.fuse_report)
    assert isinstance(fused.get_submodule("conv"), fnn.FusedConv2d)
    _, ran = run_engines(lambda: fused(x, r))
    assert bool(ran) == (path == "fused op"), ran


class InPlaceBetween(nn.Module):
    """In-place writes into the conv's input or the residual before the chain ends."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.conv = nn.Conv2d(10, 10, 3, padding=1)
        self.bn = nn.BatchNorm2d(10)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        c = self.conv(x)
        if self.how == "relu module on input":
            z = self.act(x)
            return torch.sigmoid(self.bn(c)) + z
        if self.how == "mul_ on a view of the input":
            x.view(-1).mul_(2)
            return self.bn(c)
        if self.how == "residual changed after the add":
            r = torch.sin(x)
            out = c + r
            r.zero_()
            return F.relu(out) + r
        if self.how == "result of an in-place relu statement":
            y = self.bn(c)
            y.relu_()
            F.relu(y, inplace=True)
            self.act(y)
            return y
        raise AssertionError(self.how)


@pytest.mark.parametrize("how", ["relu module on input", "mul_ on a view of the input",
                                 "residual changed after the add", "result of an in-place relu statement"])
def test_in_place_writes_around_a_chain(how):
    torch.manual_seed(7)
    model = randomize_any(InPlaceBetween(how))
    fused = check_same(model, torch.randn(2, 10, 5, 5))
    if how == "result of an in-place relu statement":  # conv + bn fold; the relu statements stay
        assert fused_names(fused) == {"conv + bn + identity -> conv"}, str(fused.fuse_report)
    else:
        assert fused.fuse_report.fused == [], str(fused.fuse_report)
        assert "in place" in dict(fused.fuse_report.skipped)["conv"], str(fused.fuse_report)


def test_modules_with_hooks_are_not_fused():
    torch.manual_seed(8)
    model = nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Conv2d(3, 10, 3)), nn.ReLU(),
                          nn.Conv2d(10, 10, 3), nn.BatchNorm2d(10), nn.SiLU(),
                          nn.Conv2d(10, 10, 1), nn.Tanh())
    randomize_any(model)
    calls = []
    model[2].register_forward_hook(lambda m, i, o: calls.append("conv"))
    model[6].register_forward_pre_hook(lambda m, i: calls.append("tanh"))
    fused = check_same(model, torch.randn(2, 3, 9, 8))
    reasons = dict(fused.fuse_report.skipped)
    assert "not an nn.Conv2d" in reasons["0"] and "forward hooks" in reasons["2"], reasons
    assert fused.fuse_report.fused == [] and reasons["5"] == "no batch norm, activation or add follows", reasons
    calls.clear()
    with torch.no_grad():
        fused(torch.randn(1, 3, 9, 8))
    assert calls == ["conv", "tanh"]

    legacy = nn.Sequential(nn.utils.weight_norm(nn.Conv2d(3, 4, 3)), nn.ReLU()).eval()  # a forward pre-hook
    with torch.no_grad():
        legacy[0].weight_g.mul_(3)
    fused = check_same(legacy, torch.randn(2, 3, 6, 6), fused=fnn.fuse(legacy, inplace=True))
    assert "forward pre hooks" in dict(fused.fuse_report.skipped)["0"], str(fused.fuse_report)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("block,c_in", [(lambda: BasicBlock(10, 10), 10), (lambda: Bottleneck(3, 3, stride=2), 3),
                                        (lambda: InvertedResidual(10, 10, 1, 3), 10)],
                         ids=["basic", "bottleneck-down", "mbv2"])
def test_half_precision_models(device, dtype, block, c_in):
    torch.manual_seed(9)
    model = randomize(block()).to(device, dtype)
    x = torch.randn(2, c_in, 9, 7, device=device, dtype=dtype)
    fused = check_same(model, x)
    assert fused.fuse_report.fused and not any(isinstance(m, nn.BatchNorm2d) for m in fused.modules())
    assert all(p.dtype == dtype for p in fused.parameters())


class TrainNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 10, 3, padding=1)
        self.conv1 = nn.Conv2d(10, 10, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(10)
        self.conv2 = nn.Conv2d(10, 10, 3, padding=1)
        self.conv3 = nn.Conv2d(10, 7, 1)

    def forward(self, x):
        x = F.leaky_relu(self.stem(x), 0.1)
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.silu(self.conv2(y) + x)
        return torch.sigmoid(self.conv3(y))


@pytest.mark.parametrize("engine", ["auto", *fnn.conv_engines("cpu")])
def test_gradients_in_training_mode(engine):
    """Training-mode batch norm stays; the chains without one fuse, and every gradient (input and each
    parameter the fused model still has, by name) matches the original's, error vs error against
    float64; the batch norm's running statistics update alike. Each engine forced in turn."""
    torch.manual_seed(10)
    model = randomize_any(TrainNet()).train()
    fused = fnn.fuse(model)
    print(fused.fuse_report)
    assert fused_names(fused) == {"stem + leaky_relu(0.1) -> stem", "conv2 + add + silu -> conv2",
                                  "conv3 + sigmoid -> conv3"}, str(fused.fuse_report)
    assert dict(fused.fuse_report.skipped)["conv1"] == "bn1 is a BatchNorm2d in training mode"
    x = torch.randn(3, 3, 7, 6)
    g = torch.randn(3, 7, 7, 6)

    def grads(m, dtype):
        xi = x.to(dtype, copy=True).requires_grad_()
        (m(xi) * g.to(dtype)).sum().backward()
        return {"input": xi.grad, **{k: p.grad for k, p in m.named_parameters()}}

    ref64 = copy.deepcopy(model).double()
    with fnn.use_conv_engine(engine):
        ours, ran = run_engines(lambda: grads(fused, torch.float32))
    assert ran if engine == "auto" else ran == [engine] * 3, ran  # auto times the engines on a new key
    torch_own, ref = grads(model, torch.float32), grads(ref64, torch.float64)
    assert set(ours) == set(torch_own), (sorted(ours), sorted(torch_own))
    for k in ours:
        assert ours[k] is not None, f"no gradient for {k}"
        check_error(f"grad of {k}", ours[k], ref[k], torch_own[k], torch.float32)
    for k in ("running_mean", "running_var"):
        check_error(f"bn1.{k}", getattr(fused.bn1, k), getattr(ref64.bn1, k), getattr(model.bn1, k), torch.float32)


class Context(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(10, 10, 1)

    def forward(self, x):
        return x + self.conv(x.mean((2, 3), keepdim=True))


def test_fusing_twice_changes_nothing():
    torch.manual_seed(11)
    model = randomize(nn.Sequential(BasicBlock(10, 10), Context()))
    x = torch.randn(2, 10, 7, 7)
    once = fnn.fuse(model)
    twice = fnn.fuse(once)
    assert twice.fuse_report.fused == [], str(twice.fuse_report)
    assert sum(isinstance(m, fnn.FusedConv2d) for m in twice.modules()) == len(once.fuse_report.fused) == 3
    check_same(model, x, fused=twice)
    buf = io.BytesIO()
    torch.save(once, buf)
    buf.seek(0)
    check_same(model, x, fused=torch.load(buf, weights_only=False))  # FusedConv2dAdd pickles


def test_eager_fallback_knows_every_activation():
    """FusedConv2dAdd's eager fallback (_activations.EAGER) computes every activation as torch does."""
    from fastpipe.nn import _activations

    t = torch.randn(4, 5, 6)
    for act, kw in ACTIVATIONS:
        name, args = _activations.resolve(act, kw)
        want = eager_activation(t, act, kw)
        torch.testing.assert_close(_activations.EAGER[name](t, *args), want, rtol=0, atol=0)
        u = t.clone()
        torch.testing.assert_close(_activations.EAGER_INPLACE[name](u, *args), want, rtol=0, atol=0)
        if name not in ("identity", "gelu", "gelu_tanh"):  # these have no in-place form
            torch.testing.assert_close(u, want, rtol=0, atol=0, msg=f"{name} did not write in place")


def test_example_inputs_keep_stock_sites_where_fusion_loses(monkeypatch):
    """With example inputs every fused site is timed on what it gets against its stock twin; a site
    where fusion is not faster computes the stock way, with the reason in the report, and the model's
    outputs do not change either way."""
    from fastpipe.nn import _fuse_timing

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 8, 1), nn.SiLU()).eval()
    x = torch.randn(2, 3, 9, 9)
    with torch.no_grad():
        want = model(x)
    # Make the fused path look slower than the stock one at every site: all of them are kept stock. (The
    # timed calls are `lambda fused=...: run(fused)`: their default says which path a call takes.)
    real = _fuse_timing._seconds_per_call
    monkeypatch.setattr(_fuse_timing, "_seconds_per_call", lambda fn, inner: real(fn, inner) + (
        1.0 if getattr(fn, "__defaults__", None) and fn.__defaults__[0] is True else 0.0))
    fused = fnn.fuse(model, example_inputs=(x,))
    kept = dict(fused.fuse_report.kept)
    assert len(fused.fuse_report.fused) == 2 and len(kept) == 2, fused.fuse_report
    assert all("fused" in why and "vs stock" in why and " (x" in why and "[2," in why for why in kept.values()), kept
    sites = [m for m in fused.modules() if isinstance(m, fnn.FusedConv2d)]
    assert [m.fused for m in sites] == [False, False] and "fused=False" in repr(sites[0])
    with torch.no_grad():
        torch.testing.assert_close(fused(x), want)
    monkeypatch.undo()
    plain = fnn.fuse(model)
    assert plain.fuse_report.kept == [] and all(m.fused for m in plain.modules() if isinstance(m, fnn.FusedConv2d))
    with torch.no_grad():
        torch.testing.assert_close(plain(x), want)
