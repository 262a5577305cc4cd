"""The augmentations' limits are the engine's, checked in C++ where a spec becomes its parameters: a spec
built past fastpipe/augment.py's checks (as _C.ImageTransformParams takes it) is refused there, never run
with ops silently dropped or a blur reading outside the image."""

import pytest

from fastpipe._ext import _C

IDENTITY = [(0, False, 1.0, 0, 0)]  # one candidate: Identity, no magnitudes


def params(stages, candidates=(), h=8, w=8):
    return _C.ImageTransformParams(
        mode="center", out_height=h, out_width=w, area=(1.0, 1.0), ratio=(1.0, 1.0), resize_short=0,
        resize_height=0, resize_width=0, mirror=0.0, out_nhwc=False, out_dtype="uint8", scale=[1.0] * 3,
        shift=[0.0] * 3, seed=0, max_dct_denom=1, augment_stages=list(stages),
        augment_candidates=list(candidates), augment_magnitudes=[])


def test_more_ops_a_sample_than_the_engine_holds_are_refused():
    def one_of(n):
        return dict(kind=1, num_ops=n, first=0, count=1)

    params([one_of(12), one_of(3), dict(kind=4)], IDENTITY)  # 16: the most
    with pytest.raises(RuntimeError, match="draw up to 17 ops a sample; at most 16"):
        params([one_of(12), one_of(4), dict(kind=4)], IDENTITY)
    augmix = dict(kind=6, chain_depth=3, mixture_width=3, alpha=1.0, first=0, count=1)  # 1 + 3 x 4 = 13
    params([augmix, one_of(3)], IDENTITY)
    with pytest.raises(RuntimeError, match="draw up to 17 ops"):
        params([augmix, one_of(3), dict(kind=5, taps=(3, 3), sigma=(0.5, 1.0))], IDENTITY)


def test_a_blur_larger_than_the_output_is_refused():
    blur = dict(kind=5, taps=(17, 3), sigma=(0.5, 1.0))
    params([blur], h=9, w=9)  # radius 8 < 9
    with pytest.raises(RuntimeError, match=r"blur's kernel \(17 x 3\) must fit the 8 x 9 output"):
        params([blur], h=9, w=8)
    with pytest.raises(RuntimeError, match="must fit"):
        params([dict(kind=5, taps=(1, 5), sigma=(0.5, 1.0))], h=2, w=30)
