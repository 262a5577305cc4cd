"""A small JPEG folder and every sample's output per epoch, for the tests of the per-sample transforms
fused after the resize (test_image_erasing.py, test_image_augment.py)."""

import torch

import fastpipe

from jpegs import jpeg_bytes, picture, write


def jpeg_root(tmp_path, rng):
    """Seven JPEGs of awkward sizes and all three samplings in two classes; the folder's path."""
    r = tmp_path / "t"
    for k, (h, w) in enumerate([(75, 100), (100, 75), (61, 89), (40, 40), (90, 31), (120, 160), (33, 47)]):
        write(str(r / f"c{k % 2}" / f"{k}.jpg"), jpeg_bytes(picture(rng, h, w), subsampling=k % 3))
    return str(r)


def outputs(ds, t, seed=4, epochs=2, **kw):
    """Every sample's output in each epoch, in sample order, NCHW."""
    ld = fastpipe.Loader(ds, batch_size=3, transforms={0: t}, seed=seed, timeout=60, **kw)
    per_epoch = []
    for _ in range(epochs):
        x = torch.cat([b for b, _ in ld])
        per_epoch.append(x.permute(0, 3, 1, 2) if t.layout == "NHWC" else x)
    return per_epoch
