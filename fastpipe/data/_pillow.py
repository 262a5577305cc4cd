"""Pillow as the image columns' fallback decoder: the formats the reader threads have no decoder for
(BMP, GIF, TIFF, PNM, animated WebP, ...) are opened exactly as torchvision's ImageFolder opens them."""

import io

import numpy as np


def decode_rgb(data):
    """``Image.open(...).convert("RGB")`` of encoded bytes (any buffer), as an (H, W, 3) uint8 array.
    Called from the reader threads, with the GIL held for this call only."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(im.convert("RGB"))
    except UnidentifiedImageError:
        raise ValueError("not a format it knows") from None


def image_size(path):
    """(height, width) from the file's header as Pillow reads it, or (0, 0, why) when it cannot."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        return 0, 0, "Pillow is not installed to read it"
    try:
        with Image.open(path) as im:
            w, h = im.size
        return h, w, None
    except UnidentifiedImageError:
        return 0, 0, "Pillow cannot read it either (not a format it knows)"
    except Exception as e:  # Pillow raises many types for what it cannot read
        return 0, 0, f"Pillow cannot read it either ({type(e).__name__}: {e})"
