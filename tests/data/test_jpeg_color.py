"""The device decode's colour model (csrc/kernels/jpeg_color.h): a JPEG's YCbCr planes, as a GPU decoder's
planar output holds them, upsampled and converted per pixel the way libjpeg-turbo decodes to RGB. Checked
pixel for pixel against libjpeg's own decode of the same file, for every chroma sampling the device
takes (4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1, grayscale) and sizes whose chroma rows are 1 to 3 samples
wide (libjpeg's box instead of its triangle filter) or whose sizes are odd.
"""

import numpy as np
import pytest

import fastpipe
from jpegs import SAMPLINGS, jpeg_bytes, picture

SIZES = [(1, 1), (2, 3), (5, 2), (3, 5), (7, 6), (17, 33), (64, 48), (97, 131)]


@pytest.mark.parametrize("sampling", sorted(SAMPLINGS))
def test_the_model_is_libjpegs_decode(rng, sampling):
    for h, w in SIZES:
        data = SAMPLINGS[sampling](picture(rng, h, w, cells=3))
        model, libjpeg, planes = fastpipe._ext._C._jpeg_ycc_model(data)
        assert model.shape == libjpeg.shape == (h, w, 3)
        diff = np.argwhere(model != libjpeg)
        assert len(diff) == 0, f"{h}x{w}: {len(diff)} values differ, first at {diff[:3].tolist()}"
        assert libjpeg.std() > 0 or h * w == 1  # a picture, not a flat field


def test_the_planes_are_libjpegs_raw_output(rng):
    """Y at full size and the chroma planes at libjpeg's downsampled sizes, packed one after another."""
    h, w = 37, 53
    pic = picture(rng, h, w)
    _, _, planes = fastpipe._ext._C._jpeg_ycc_model(jpeg_bytes(pic, subsampling=2))
    assert len(planes) == h * w + 2 * ((h + 1) // 2) * ((w + 1) // 2)
    y = np.frombuffer(planes, np.uint8, h * w).reshape(h, w).astype(float)
    # BT.601 luma of the picture, within the JPEG's quantisation.
    luma = pic.astype(float) @ np.array([0.299, 0.587, 0.114])
    assert np.abs(y - luma).mean() < 4


def test_what_the_model_refuses(rng):
    with pytest.raises(ValueError, match="not a JPEG"):
        fastpipe._ext._C._jpeg_ycc_model(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(ValueError):
        fastpipe._ext._C._jpeg_ycc_model(jpeg_bytes(picture(rng, 20, 20), mode="CMYK"))
