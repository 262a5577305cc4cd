"""What the installed Pillow's resize computes that other versions do not, measured once, so that the
fused bicubic resize (resize_as="pil") gives what torchvision gives beside it."""

import functools


@functools.lru_cache(maxsize=None)
def vertical_first():
    """Whether Pillow sums a bicubic resize whose height loses more than twice the pixels its width loses
    with its vertical pass first (Pillow 13 on; earlier versions always pass horizontally first). Both passes clip to uint8, so the
    order shows where bicubic overshoots: measured on an image where the two orders differ. True without
    Pillow (the newest behaviour)."""
    try:
        import numpy as np
        from PIL import Image
    except ImportError:
        return True
    a = np.zeros((9, 4, 3), np.uint8)
    a[::2, 1::2] = 255
    a[1::2, ::2] = 255
    im = Image.fromarray(a)
    size = (7, 3)  # the height loses 6 pixels, the width gains 3
    full = np.asarray(im.resize(size, Image.BICUBIC))
    vertical = np.asarray(im.resize((4, 3), Image.BICUBIC).resize(size, Image.BICUBIC))
    horizontal = np.asarray(im.resize((7, 9), Image.BICUBIC).resize(size, Image.BICUBIC))
    if (vertical == horizontal).all():
        raise AssertionError("fastpipe.pil_resize: the probe image does not tell the two orders apart")
    return bool((full == vertical).all())
