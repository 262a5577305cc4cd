"""fuse() on hand-built torchvision-style blocks (ResNet basic/bottleneck, MobileNetV2) and edge cases."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fastpipe.nn as fnn
from conv_ref import DEVICES, check_error


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
    assert kinds.count(fnn.FusedConv2d) == expect_fused
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
