"""Image files of every format torchvision's ImageFolder reads, for the format tests: PNGs written by a
small encoder of our own (every colour type and bit depth, Adam7 interlacing, short palettes, every
row filter), everything else by Pillow. Pillow's decode (``Image.open(...).convert("RGB")``, what
torchvision's default loader does) is the reference they are checked against."""

import io
import struct
import zlib

import numpy as np
from PIL import Image

# (colour type, bit depth) pairs PNG allows.
PNG_MODES = [(0, 1), (0, 2), (0, 4), (0, 8), (0, 16), (2, 8), (2, 16), (3, 1), (3, 2), (3, 4), (3, 8), (4, 8),
             (4, 16), (6, 8), (6, 16)]
CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]  # x0, y0, dx, dy


def _chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _pack_row(samples, depth):
    """One row of samples (ints) as PNG bytes: big-endian 16-bit, or packed from the high bit down."""
    if depth == 16:
        return samples.astype(">u2").tobytes()
    if depth == 8:
        return samples.astype(np.uint8).tobytes()
    per = 8 // depth
    padded = np.zeros(-(-len(samples) // per) * per, np.uint8)
    padded[:len(samples)] = samples
    shifts = (8 - depth * (np.arange(per) + 1)).astype(np.uint8)
    return (padded.reshape(-1, per) << shifts).sum(axis=1).astype(np.uint8).tobytes()


def _paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
    return np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))


def _filter(raw, prev, bpp, kind):
    """PNG row filter `kind` (0-4) applied to one row of bytes."""
    x = np.frombuffer(raw, np.uint8).astype(np.int32)
    up = np.frombuffer(prev, np.uint8).astype(np.int32) if prev is not None else np.zeros_like(x)
    left = np.concatenate([np.zeros(bpp, np.int32), x[:-bpp]]) if len(x) > bpp else np.zeros_like(x)
    upleft = np.concatenate([np.zeros(bpp, np.int32), up[:-bpp]]) if len(x) > bpp else np.zeros_like(x)
    pred = [np.zeros_like(x), left, up, (left + up) // 2, _paeth(left, up, upleft)][kind]
    return bytes([kind]) + ((x - pred) % 256).astype(np.uint8).tobytes()


def _scanlines(samples, depth, rng):
    """Filtered scanlines of an (h, w, channels) array of samples, each row with a random filter."""
    h, w, c = samples.shape
    bpp = max(1, c * depth // 8)
    out, prev = [], None
    for y in range(h):
        raw = _pack_row(samples[y].reshape(-1), depth) if depth >= 8 else _pack_row(samples[y, :, 0], depth)
        out.append(_filter(raw, prev, bpp, int(rng.integers(0, 5))))
        prev = raw
    return b"".join(out)


def png_bytes(samples, color_type, depth, rng, *, palette=None, interlace=False, trns=None, chunks_before=()):
    """A PNG of ``samples`` ((h, w, channels) ints within the depth; palette indices for colour type 3)."""
    h, w, _ = samples.shape
    header = struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, 1 if interlace else 0)
    if interlace:
        data = b"".join(_scanlines(samples[y0::dy, x0::dx], depth, rng)
                        for x0, y0, dx, dy in _ADAM7 if samples[y0::dy, x0::dx].size)
    else:
        data = _scanlines(samples, depth, rng)
    out = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header)
    for kind, payload in chunks_before:
        out += _chunk(kind, payload)
    if palette is not None:
        out += _chunk(b"PLTE", np.asarray(palette, np.uint8).tobytes())
    if trns is not None:
        out += _chunk(b"tRNS", trns)
    z = zlib.compress(data, 6)
    cut = max(1, len(z) // 3)  # image data over several IDAT chunks, as encoders split it
    return out + _chunk(b"IDAT", z[:cut]) + _chunk(b"IDAT", z[cut:]) + _chunk(b"IEND", b"")


def random_png(rng, color_type, depth, height, width, *, interlace=False):
    """A PNG of random samples in that mode: palettes shorter than the indices reach (black past them, as
    in Pillow and libspng) and a tRNS chunk where the mode has one."""
    c = CHANNELS[color_type]
    top = (1 << depth) - 1
    if color_type == 3:
        entries = int(rng.integers(1, top + 2))
        palette = rng.integers(0, 256, (entries, 3))
        samples = rng.integers(0, min(top, entries + 2) + 1, (height, width, 1))
        trns = rng.integers(0, 256, entries // 2).astype(np.uint8).tobytes()
        return png_bytes(samples, 3, depth, rng, palette=palette, interlace=interlace, trns=trns)
    if depth == 16 and color_type == 0:
        # Mostly values below 256 (what Pillow keeps) and some above (clipped to 255).
        samples = np.where(rng.random((height, width, 1)) < 0.7, rng.integers(0, 256, (height, width, 1)),
                           rng.integers(0, top + 1, (height, width, 1)))
    else:
        samples = rng.integers(0, top + 1, (height, width, c))
    trns = struct.pack(">" + "H" * c, *rng.integers(0, top + 1, c)) if color_type in (0, 2) else None
    return png_bytes(samples, color_type, depth, rng, interlace=interlace, trns=trns)


def pillow_bytes(array, fmt, **save):
    """``array`` (H, W, 3 uint8) saved by Pillow as ``fmt`` (PNG, WEBP, BMP, GIF, TIFF, PPM, ...)."""
    im = Image.fromarray(array)
    if fmt == "GIF":
        im = im.quantize(64)
    out = io.BytesIO()
    im.save(out, format=fmt, **save)
    return out.getvalue()


def animated_webp(arrays):
    frames = [Image.fromarray(a) for a in arrays]
    out = io.BytesIO()
    frames[0].save(out, format="WEBP", save_all=True, append_images=frames[1:], duration=50, lossless=True)
    return out.getvalue()


def pil_rgb_array(data):
    """What torchvision's ImageFolder trains on, as an (H, W, 3) uint8 array."""
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))
