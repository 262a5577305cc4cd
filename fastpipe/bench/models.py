"""The training suite's models: a ResNet-style and a MobileNetV2-style classifier, torchvision-free.

Both take NCHW images of any size and adapt their stem to it: small images (CIFAR-like) keep their
resolution in the stem, large ones (ImageNet-like) are reduced 4x as in the papers. ``width`` scales
every layer's channels (1.0 is the paper's), so a CPU run can use a narrower net that still has the
models' shape: the same convolution kinds, residual adds and activations.
"""

import torch.nn as nn

__all__ = ["MODELS", "resnet", "mobilenet_v2"]


def _ch(c, width):
    return max(8, int(round(c * width / 8)) * 8)


def _conv_bn(cin, cout, k, stride=1, groups=1, act="relu"):
    """Conv -> BatchNorm [-> activation]: the chain fastpipe.nn.fuse folds and fuses in eval."""
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act:
        layers.append(nn.ReLU6(inplace=True) if act == "relu6" else nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


def _stem(cout, image_size, act):
    if image_size >= 96:  # ImageNet-like: a strided 7x7 (3x3 for MobileNet) and a pool, as the papers
        k = 7 if act == "relu" else 3
        return nn.Sequential(_conv_bn(3, cout, k, 2, act=act), nn.MaxPool2d(3, 2, 1))
    return _conv_bn(3, cout, 3, 1, act=act)


class _Basic(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.a = _conv_bn(cin, cout, 3, stride)
        self.b = _conv_bn(cout, cout, 3, act=False)
        self.skip = _conv_bn(cin, cout, 1, stride, act=False) if stride != 1 or cin != cout else nn.Identity()
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.b(self.a(x)) + self.skip(x))


class _InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        layers = [_conv_bn(cin, hidden, 1, act="relu6")] if expand != 1 else []
        layers += [_conv_bn(hidden, hidden, 3, stride, groups=hidden, act="relu6"), _conv_bn(hidden, cout, 1, act=False)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.block(x) if self.residual else self.block(x)


def _head(cin, num_classes):
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes))


def resnet(num_classes=10, image_size=32, width=1.0, blocks=(2, 2, 2, 2)):
    """ResNet-18's layout (BasicBlocks, 64-128-256-512 channels at width 1)."""
    chans = [_ch(c, width) for c in (64, 128, 256, 512)]
    layers, cin = [_stem(chans[0], image_size, "relu")], chans[0]
    for i, (c, n) in enumerate(zip(chans, blocks)):
        for j in range(n):
            layers.append(_Basic(cin, c, 2 if i > 0 and j == 0 else 1))
            cin = c
    return nn.Sequential(*layers, _head(cin, num_classes))


def mobilenet_v2(num_classes=10, image_size=32, width=1.0):
    """MobileNetV2's inverted residuals (expand 1x1, depthwise 3x3, project 1x1; ReLU6)."""
    # (expansion, channels, repeats, stride) from the paper; the first stride-2 stages keep small images' size.
    setting = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
               (6, 320, 1, 1)]
    cin = _ch(32, width)
    layers = [_stem(cin, image_size, "relu6")]
    for i, (t, c, n, s) in enumerate(setting):
        cout = _ch(c, width)
        for j in range(n):
            stride = s if j == 0 and not (image_size < 96 and i == 1) else 1
            layers.append(_InvertedResidual(cin, cout, stride, t))
            cin = cout
    last = _ch(1280, max(width, 1.0))
    return nn.Sequential(*layers, _conv_bn(cin, last, 1, act="relu6"), _head(last, num_classes))


MODELS = {"resnet": resnet, "mobilenet_v2": mobilenet_v2}
