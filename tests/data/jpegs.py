"""JPEG files for the image tests, written with Pillow, and the references they are checked against:
Pillow's own decode, crop and resize (torchvision's PIL path: ``resized_crop`` and ``Resize`` +
``CenterCrop`` on PIL images call exactly these).

Content is natural-image-like (smooth colour fields, edges and grain) so that chroma subsampling and
the antialiasing filter both matter; sizes are awkward on purpose.
"""

import io
import os
import shutil
import subprocess

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

import fastpipe  # noqa: E402

if not fastpipe._ext._C.JPEG["decode"]:  # tests/test_build.py fails where libjpeg is installed but not built in
    pytest.skip("fastpipe was built without JPEG decoding (libjpeg-turbo's headers were missing)",
                allow_module_level=True)

# The exact path is within one level of Pillow's (which rounds to uint8 between its two resize passes).
EXACT_TOL = 1.0 + 1e-3  # plus float32 rounding of x / 255 * 255


def picture(rng, height, width, grain=10, cells=12):
    """An RGB uint8 image: a smooth random colour field (a cell per `cells` pixels), a few hard edges and
    uniform grain of +-`grain` levels."""
    small = rng.integers(0, 256, (max(2, height // cells), max(2, width // cells), 3), dtype=np.uint8)
    field = np.asarray(Image.fromarray(small).resize((width, height), Image.BICUBIC), np.int16)
    yy, xx = np.mgrid[0:height, 0:width]
    edges = (xx + 2 * yy) % max(3, width // 3) < 2
    field[edges] = 255 - field[edges]
    return np.clip(field + rng.integers(-grain, grain + 1, field.shape), 0, 255).astype(np.uint8)


def jpeg_bytes(array, mode="RGB", **save):
    """``array`` (H, W, 3) encoded as a JPEG of ``mode`` (RGB, L for grayscale, CMYK)."""
    im = Image.fromarray(array).convert(mode)
    out = io.BytesIO()
    im.save(out, format="JPEG", quality=save.pop("quality", 90), **save)
    return out.getvalue()


CJPEG = shutil.which("cjpeg")  # libjpeg-turbo-progs (`make system-deps`): Pillow writes no 4:4:0 or 4:1:1


def cjpeg_bytes(array, sample):
    """``array`` encoded by libjpeg's cjpeg with luma sampling ``sample`` ("1x2": 4:4:0, "4x1": 4:1:1);
    skips the test where cjpeg is not installed."""
    if CJPEG is None:
        pytest.skip("cjpeg (libjpeg-turbo-progs) is not installed: `make system-deps` installs it")
    ppm = io.BytesIO()
    Image.fromarray(array).save(ppm, format="PPM")
    return subprocess.run([CJPEG, "-quality", "90", "-sample", sample], input=ppm.getvalue(),
                          capture_output=True, check=True).stdout


# Every chroma sampling the device decodes, by name: an encoder of (H, W, 3) uint8 arrays (those in
# NEEDS_CJPEG skip the test where cjpeg is missing).
NEEDS_CJPEG = frozenset({"440", "411"})
SAMPLINGS = {
    "444": lambda a: jpeg_bytes(a, subsampling=0),
    "422": lambda a: jpeg_bytes(a, subsampling=1),
    "420": lambda a: jpeg_bytes(a, subsampling=2),
    "gray": lambda a: jpeg_bytes(a, mode="L"),
    "440": lambda a: cjpeg_bytes(a, "1x2"),
    "411": lambda a: cjpeg_bytes(a, "4x1"),
}


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


def pil_rgb(data_or_path):
    """Pillow's decode, as torchvision's ImageFolder loader does it."""
    src = io.BytesIO(data_or_path) if isinstance(data_or_path, bytes) else data_or_path
    with Image.open(src) as im:
        return im.convert("RGB")


def reference_resized_crop(im, top, left, height, width, size, flip):
    """torchvision's resized_crop(img, top, left, height, width, size) + hflip on a PIL image, as float."""
    out = im.crop((left, top, left + width, top + height)).resize((size[1], size[0]), Image.BILINEAR)
    if flip:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(out, np.float32)


def reference_resize(im, resize):
    """torchvision's Resize(resize) of a PIL image (antialiased bilinear; an int: the shorter side), as float
    (H, W, 3); None: the image as it is."""
    w, h = im.size
    if isinstance(resize, int):
        if w <= h:
            nw, nh = resize, int(resize * h / w)
        else:
            nh, nw = resize, int(resize * w / h)
        im = im.resize((nw, nh), Image.BILINEAR)
    elif resize is not None:
        im = im.resize((resize[1], resize[0]), Image.BILINEAR)
    return np.asarray(im, np.float32)


def reference_padded_crop(im, size, resize, top, left, flip=False):
    """torchvision's Resize(resize) + RandomCrop(size, padding) at the crop's place (top, left) in the
    resized image, where negative or past its end is the zero padding; then flipped where ``flip``."""
    a = reference_resize(im, resize)
    oh, ow = size
    m = max(oh, ow) + max(a.shape[:2])  # zeros on every side, more than any place reaches
    padded = np.zeros((a.shape[0] + 2 * m, a.shape[1] + 2 * m, 3), np.float32)
    padded[m:m + a.shape[0], m:m + a.shape[1]] = a
    out = padded[top + m:top + m + oh, left + m:left + m + ow]
    return out[:, ::-1] if flip else out


def reference_center_crop(im, size, resize, at=None, flip=False):
    """torchvision v2's Resize(resize) (PIL, antialiased bilinear) + CenterCrop(size), zero padding included;
    ``at``: (top, left) of a RandomCrop in the resized image instead (an axis the crop pads is centred);
    then flipped where ``flip``."""
    a = reference_resize(im, resize)
    oh, ow = size
    ih, iw = a.shape[:2]
    if oh > ih or ow > iw:  # torchvision pads (d // 2 before, the rest after), then crops the centre
        top, left = max(0, (oh - ih) // 2), max(0, (ow - iw) // 2)
        padded = np.zeros((max(oh, ih), max(ow, iw), 3), np.float32)
        padded[top:top + ih, left:left + iw] = a
        a = padded
        ih, iw = a.shape[:2]
    top, left = int(round((ih - oh) / 2.0)), int(round((iw - ow) / 2.0))
    if at is not None:  # an axis padded above is as large as the crop: it starts at 0
        top, left = (max(0, v) for v in at)
    a = a[top:top + oh, left:left + ow]
    return a[:, ::-1] if flip else a


def as_hwc_255(x, layout="NCHW"):
    """A float output image of the loader (values x / 255, no normalisation) as (H, W, 3) in [0, 255]."""
    x = x.float().numpy() * 255.0
    return x.transpose(1, 2, 0) if layout == "NCHW" else x


def assert_on_boxes(samples, outputs, boxes, reference):
    """Each output image (a float tensor of the loader, values x / 255) within a level of
    ``reference(PIL image, box)`` at the box reported for its sample."""
    for (path, _), x, box in zip(samples, outputs, boxes, strict=True):
        diff = np.abs(as_hwc_255(x) - reference(pil_rgb(path), box))
        assert diff.max() <= EXACT_TOL, f"{os.path.basename(path)} box {box}: {diff.max()}"


def make_tree(root, rng, sizes, classes=("b_class", "a_class")):
    """An ImageFolder tree: images of the given (height, width) sizes spread over the classes (created in
    unsorted order, one in a nested folder, one with an upper-case extension), plus a non-image file.
    Returns the paths written, sorted as torchvision's ImageFolder sorts them."""
    paths = []
    for k, (h, w) in enumerate(sizes):
        cls = classes[k % len(classes)]
        sub = "nested" if k == 2 else ""
        ext = ".JPG" if k == 3 else ".jpg"
        paths.append(write(os.path.join(root, cls, sub, f"img{k:03d}{ext}"), jpeg_bytes(picture(rng, h, w))))
    write(os.path.join(root, classes[0], "notes.txt"), b"not an image")
    return paths
