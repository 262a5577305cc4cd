"""Where the torch in use fuses a multiply-add in torchvision's affine sampling (rotate, shear, translate),
measured: the fused geometric ops (csrc/kernels/augment_ops.h, images::Sampling) round their source positions
and bilinear sums as it does, so that they give torchvision's pixels where a position falls on a tie.

It is not a constant: torch's bmm sums the affine grid with a BLAS (whose kernel depends on the CPU) above
400 products and with its own loop below, and its grid_sample kernel is vectorised with FMA (AVX2,
AVX-512) or not (ATEN_CPU_CAPABILITY=default). Each is measured against both roundings, emulated here in
numpy (float32 operations; a fused one in float64, exact for the products of float32 values).
"""

import functools

import numpy as np
import torch

_F32 = np.float32


def _fma(a, b, c):
    wide = np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)
    return wide.astype(_F32)


def _affine_grid(theta, height, width):
    """torchvision's _affine_grid (transforms/v2/functional/_geometry.py) on a copy of theta: (h, w, 2)."""
    try:
        from torchvision.transforms.v2.functional._geometry import _affine_grid as tv_grid
    except ImportError:
        tv_grid = None
    if tv_grid is not None:
        return tv_grid(theta.clone(), w=width, h=height, ow=width, oh=height)[0].numpy()
    base = torch.empty(1, height, width, 3)
    base[..., 0].copy_(torch.linspace((1.0 - width) * 0.5, (width - 1.0) * 0.5, steps=width))
    base[..., 1].copy_(torch.linspace((1.0 - height) * 0.5, (height - 1.0) * 0.5, steps=height).unsqueeze_(-1))
    base[..., 2].fill_(1)
    rescaled = theta.clone().transpose(1, 2).div_(torch.tensor([0.5 * width, 0.5 * height]))
    return base.view(1, height * width, 3).bmm(rescaled).view(height, width, 2).numpy()


def _grid_fma(height, width):
    """Whether torch's grid for an output of height x width sums by * t1 fused into bx * t0."""
    rng = np.random.default_rng(height * 100003 + width)
    bx = np.arange(width, dtype=_F32) + _F32((1.0 - width) * 0.5)
    by = np.arange(height, dtype=_F32)[:, None] + _F32((1.0 - height) * 0.5)
    votes = 0
    for _ in range(3):  # a few generic matrices: the two roundings differ on some of their products
        theta = torch.from_numpy(rng.uniform(-2.0, 2.0, (1, 2, 3)).astype(_F32))
        t = theta[0].numpy() / np.array([[0.5 * width], [0.5 * height]], dtype=_F32)
        grid = _affine_grid(theta, height, width)
        for j in range(2):
            column = bx * t[j, 0]
            plain = (column + by * t[j, 1]) + t[j, 2]
            fused = _fma(by, t[j, 1], column) + t[j, 2]
            votes += int((fused != grid[..., j]).sum()) - int((plain != grid[..., j]).sum())
    return votes <= 0


def _bilinear(img, gx, gy, unnormalize_fma, interpolate_fma):
    """grid_sample(bilinear, zeros, align_corners=False) of img at (gx, gy), rounded one way or the other."""
    h, w = img.shape

    def position(g, size):
        g1 = g + _F32(1)
        return _fma(g1, _F32(size / 2), _F32(-0.5)) if unnormalize_fma else g1 * _F32(size / 2) - _F32(0.5)

    ix, iy = position(gx, w), position(gy, h)
    x0, y0 = np.floor(ix), np.floor(iy)
    to_west, to_north = ix - x0, iy - y0
    to_east, to_south = _F32(1) - to_west, _F32(1) - to_north
    v = np.zeros_like(ix)
    for cy, cx, weight in ((y0, x0, to_south * to_east), (y0, x0 + 1, to_south * to_west),
                           (y0 + 1, x0, to_north * to_east), (y0 + 1, x0 + 1, to_north * to_west)):
        inside = (cx > -1) & (cx < w) & (cy > -1) & (cy < h)
        value = np.where(inside, img[np.clip(cy, 0, h - 1).astype(int), np.clip(cx, 0, w - 1).astype(int)],
                         _F32(0))
        v = _fma(value, weight, v) if interpolate_fma else v + value * weight
    return v


@functools.lru_cache(maxsize=None)
def _sampler_fma():
    """(unnormalize_fma, interpolate_fma) of torch's grid_sample on this CPU."""
    rng = np.random.default_rng(5)
    img = rng.integers(0, 256, (13, 17)).astype(_F32)
    g = rng.uniform(-1.1, 1.1, (2, 4096)).astype(_F32)
    got = torch.nn.functional.grid_sample(torch.from_numpy(img)[None, None], torch.from_numpy(g.T.copy())[None, None],
                                          mode="bilinear", padding_mode="zeros", align_corners=False)[0, 0, 0].numpy()
    misses = {(u, i): int((_bilinear(img, g[0], g[1], u, i) != got).sum())
              for u in (True, False) for i in (True, False)}
    return min(misses, key=misses.get)


@functools.lru_cache(maxsize=64)
def affine_rounding(height, width):
    """(grid_fma, unnormalize_fma, interpolate_fma) of torchvision's affine sampling of a height x width
    uint8 image with the torch in use (images::Sampling's fields)."""
    return (_grid_fma(int(height), int(width)), *_sampler_fma())
