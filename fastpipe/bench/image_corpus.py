"""The images suite's corpora: natural-image-like photos in an ImageFolder tree, and its packed copy.

Crops of a few synthetic photo-like scenes (numpy and Pillow only: no sample photo to download or
import), colour-jittered, sharpened like a camera's output and with sensor-like grain, at ImageNet-like
sizes and file sizes (a few large ones), written once and reused while its marker (corpus.json, written
last) is there. The same images come in three kinds: ``jpeg`` (quality-90 4:2:0 JPEGs), ``png`` (every
one a PNG, as screenshots, medical or rendered data come) and ``mixed`` (90% JPEG, 5% PNG, 5% WebP, as
scraped data come).

A scene (``scene``) has what a JPEG encoder and decoder meet in a photo: smooth gradients (a sky over
ground, split at a hilly horizon; broad illumination; a vignette), texture at every scale (noise with a
natural image's 1/f amplitude spectrum: clouds, foliage and gravel finer towards the viewer, the
objects' own surfaces), hard and soft edges (40 opaque objects, ellipses, polygons, triangles and
paneled rectangles, drawn far to near and some out of focus) and muted colours with shading. The
painter then does what the earlier corpus did to matplotlib's sample photo (which made the harness
need matplotlib): a random crop, resize, unsharp mask, flip, colour jitter and grain. The grain, as
before, sets the file sizes: a 500x375 JPEG is ~100 KB (~4.2 bits per pixel), as ImageNet's and as the
photo-based corpus's were, and the images decode at the same cost per pixel as that corpus's (within a
few percent with PIL on the 2-core VM).
"""

from __future__ import annotations

import concurrent.futures
import io
import json
import math
import os
import shutil
import sys
import time
from typing import NamedTuple

import numpy as np

from fastpipe.bench import common as bc

# The corpus: crops of synthetic scenes, colour-jittered, sharpened like a camera's output and with
# sensor-like grain, saved as quality-90 4:2:0 JPEGs. GRAIN_SIGMA (grey levels) is tuned so that a
# 500x375 file is ~100 KB (ImageNet's train images average ~110 KB at ~470x390).
CLASSES = 10
SCENES = 4  # distinct scenes; each image crops one of them
SCENE_SIZE = (960, 720)  # (width, height): crops of 30-100% of it are zoomed to the image sizes
SCENE_OBJECTS = 40
SOURCE = f"{SCENES} synthetic scenes ({SCENE_SIZE[0]}x{SCENE_SIZE[1]}: gradients, 1/f texture, {SCENE_OBJECTS} objects)"
JPEG_QUALITY = 90
GRAIN_SIGMA = 14.0
GRAIN_CHROMA = 0.35  # share of independent per-channel noise; the rest is luminance grain
SHARPEN_PERCENT = 150
LARGE_EVERY = 20  # every 20th image (5%) is large: 1600x1200 and 3000x2000 in turn
CORPUS_VERSION = 2  # 2: synthetic scenes instead of matplotlib's sample photo
NOISE_TILE = 1024
KINDS = ("jpeg", "png", "mixed", "imagenet")
WEBP_QUALITY = 90
_EXTENSIONS = {"JPEG": ".jpg", "PNG": ".png", "WEBP": ".webp"}


# --------------------------------------------------------------------------------------------------
# The corpus: generated once, reused while its marker (corpus.json, written last) is there.
# --------------------------------------------------------------------------------------------------
class Corpus(NamedTuple):
    dir: str
    tree: str  # the ImageFolder tree: tree/class_XX/img_NNNNN.jpg (.png, .webp)
    packed: str  # fastpipe.write_images(tree)
    beton: str  # FFCV's copy (written only when FFCV runs)
    index: str  # fastpipe.ImageFolder's scan cache
    facts_path: str


def corpus_paths(data_dir: str, n: int, seed: int, grain: float, kind: str = "jpeg") -> Corpus:
    d = os.path.join(os.path.abspath(data_dir), f"images_n{n}_seed{seed}_grain{grain:g}_v{CORPUS_VERSION}"
                     + ("" if kind == "jpeg" else f"_{kind}"))
    return Corpus(d, os.path.join(d, "tree"), os.path.join(d, "packed"), os.path.join(d, "ffcv_q90.beton"),
                  os.path.join(d, "fastpipe_index"), os.path.join(d, "corpus.json"))


def image_shape(i: int, rng) -> tuple[int, int]:
    """(width, height) of image i: ImageNet's common sizes, and every LARGE_EVERY-th one large."""
    if i % LARGE_EVERY == LARGE_EVERY // 2:
        return (1600, 1200) if (i // LARGE_EVERY) % 2 == 0 else (3000, 2000)
    u = rng.random()
    if u < 0.45:
        return 500, 375
    if u < 0.65:
        return 375, 500
    if u < 0.85:
        return 500, 333
    return 400 + int(rng.integers(-30, 31)), 400 + int(rng.integers(-30, 31))


def size_group(w: int, h: int) -> str:
    if (w, h) in ((500, 375), (375, 500), (500, 333), (1600, 1200), (3000, 2000)):
        return f"{w}x{h}"
    return "~400x400"


def _field(rng, h: int, w: int, beta: float):
    """float32 (h, w) gaussian noise with an amplitude spectrum falling as 1/f^beta, unit std: natural
    images fall about as 1/f (beta 1: fine texture; 2 and more: smooth, cloud-like variation)."""
    fy = np.fft.fftfreq(h).astype(np.float32)[:, None]
    fx = np.fft.rfftfreq(w).astype(np.float32)[None, :]
    f = np.sqrt(fx * fx + fy * fy)
    f[0, 0] = 1.0
    shape = (h, w // 2 + 1)
    spec = (rng.standard_normal(shape, dtype=np.float32) + 1j * rng.standard_normal(shape, dtype=np.float32)) / f ** beta
    spec[0, 0] = 0
    a = np.fft.irfft2(spec, s=(h, w)).astype(np.float32)
    return a / (a.std() + 1e-12)


def scene(k: int):
    """Synthetic photo-like scene k (a PIL RGB image of SCENE_SIZE; a pure function of k): a sky over
    textured ground, objects with hard and soft edges, broad illumination and a vignette."""
    from PIL import Image, ImageDraw, ImageFilter

    rng = np.random.default_rng([k, 0x5CE7E])
    w, h = SCENE_SIZE
    yy = np.linspace(0, 1, h, dtype=np.float32)[:, None, None]
    # Sky and ground: vertical gradients either side of a hilly horizon (a row position per column).
    horizon = (rng.uniform(0.35, 0.6) + 0.06 * _field(rng, 1, w, 1.8)[0]).astype(np.float32)[None, :, None]
    sky_top, sky_low = rng.uniform([40, 80, 150], [110, 150, 230]), rng.uniform([150, 170, 190], [220, 225, 240])
    far, near = rng.uniform([60, 80, 40], [140, 150, 100]), rng.uniform([40, 40, 20], [120, 100, 70])
    t_sky = np.clip(yy / horizon, 0, 1)
    t_ground = np.clip((yy - horizon) / (1 - horizon), 0, 1)
    below = yy > horizon
    img = np.where(below, far + (near - far) * t_ground, sky_top + (sky_low - sky_top) * t_sky).astype(np.float32)
    # Clouds in the sky; on the ground, texture of patchy strength, coarser-looking near the viewer.
    img += np.where(below, 0.0, 18 * np.maximum(_field(rng, h, w, 2.2), -0.3)[..., None])
    texture = _field(rng, h, w, 1.3)[..., None] * (1 + 0.6 * _field(rng, h, w, 2.0)[..., None] ** 2)
    img += np.where(below, 16 * texture * (0.5 + t_ground), 0.0)
    # Objects, far to near: the nearer, the larger and the lower; shaded muted fills with their own
    # texture (and panels on the rectangles), anti-aliased hard edges or out of focus.
    for j in range(SCENE_OBJECTS):
        depth = (j + 1) / SCENE_OBJECTS
        s = 0.04 + 0.3 * depth * rng.uniform(0.4, 1.0)
        cx = rng.uniform(0, w)
        base = float(horizon[0, min(w - 1, int(cx)), 0]) * h + depth * rng.uniform(0, 0.45) * h
        ow, oh = s * w * rng.uniform(0.4, 1.2), s * h * rng.uniform(0.5, 2.0)
        kind = int(rng.integers(4))
        x0, x1 = int(max(0, cx - ow / 2 - 8)), int(min(w, cx + ow / 2 + 8))
        y0, y1 = int(max(0, base - oh - 8)), int(min(h, base + 8))
        if y1 - y0 < 2 or x1 - x0 < 2:
            continue
        cx, base = cx - x0, base - y0  # drawn in the object's own box
        box = [cx - ow / 2, base - oh, cx + ow / 2, base]
        mask = Image.new("L", (x1 - x0, y1 - y0), 0)
        draw = ImageDraw.Draw(mask)
        if kind == 0:
            draw.rectangle(box, fill=255)
        elif kind == 1:
            draw.ellipse(box, fill=255)
        elif kind == 2:
            angles = np.sort(rng.uniform(0, 2 * math.pi, int(rng.integers(5, 10))))
            draw.polygon([(cx + ow / 2 * math.cos(a) * rng.uniform(0.5, 1.0),
                           base - oh / 2 + oh / 2 * math.sin(a) * rng.uniform(0.5, 1.0)) for a in angles], fill=255)
        else:
            draw.polygon([(cx, base - oh), (cx - ow / 2, base), (cx + ow / 2, base)], fill=255)
        mask = mask.filter(ImageFilter.GaussianBlur(rng.uniform(0, 3) if rng.random() < 0.3 else 0.6))
        m = np.asarray(mask, np.float32)[..., None] / 255
        grey = rng.uniform(30, 220)
        colour = (grey + rng.uniform(-1, 1, 3) * rng.uniform(10, 60)).astype(np.float32)
        ys = np.linspace(0, 1, y1 - y0, dtype=np.float32)[:, None, None]
        xs = np.linspace(-1, 1, x1 - x0, dtype=np.float32)[None, :, None]
        fill = colour * (1 + rng.uniform(-0.3, 0.3) * ys + rng.uniform(-0.25, 0.25) * xs)
        if kind == 0:  # a grid of darker panels (windows)
            py, px = rng.uniform(6, 20), rng.uniform(6, 20)
            cells = ((np.arange(y0, y1)[:, None, None] % py) < 0.6 * py) & ((np.arange(x0, x1)[None, :, None] % px) < 0.6 * px)
            fill = np.where(cells, fill * rng.uniform(0.5, 0.8), fill)
        fill += rng.uniform(3, 25) * _field(rng, y1 - y0, x1 - x0, rng.uniform(1.0, 2.0))[..., None]
        img[y0:y1, x0:x1] = img[y0:y1, x0:x1] * (1 - m) + fill * m
    # Light: a broad illumination field and a vignette.
    img *= (1 + 0.12 * _field(rng, h, w, 3.0))[..., None]
    xv = np.linspace(-1, 1, w, dtype=np.float32)[None, :, None]
    img *= 1 - 0.125 * ((2 * yy - 1) ** 2 + xv ** 2)
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


class _Painter:
    """Makes the corpus's images from the synthetic scenes; thread-safe (reads shared arrays only)."""

    def __init__(self, grain: float, seed: int):
        self.scenes = [scene(k) for k in range(SCENES)]  # the same scenes for every seed and corpus
        self.grain = float(grain)
        # A tile of unit gaussian noise cut at random offsets: far cheaper than fresh normals per pixel.
        self.noise = np.random.default_rng([seed, 1 << 20]).standard_normal((NOISE_TILE, NOISE_TILE, 3),
                                                                           dtype=np.float32)

    def _grain(self, rng, h, w):
        out = np.empty((h, w, 3), np.float32)
        for y in range(0, h, NOISE_TILE):
            for x in range(0, w, NOISE_TILE):
                hh, ww = min(NOISE_TILE, h - y), min(NOISE_TILE, w - x)
                oy, ox = int(rng.integers(0, NOISE_TILE - hh + 1)), int(rng.integers(0, NOISE_TILE - ww + 1))
                out[y:y + hh, x:x + ww] = self.noise[oy:oy + hh, ox:ox + ww]
        lum = out[..., :1] * math.sqrt(1 - GRAIN_CHROMA ** 2)
        return self.grain * (lum + GRAIN_CHROMA * out)

    def encode(self, i: int, seed: int, fmt: str = "JPEG", variant: str = "4:2:0") -> tuple[bytes, int, int]:
        """Image i of the corpus (a pure function of (seed, i)) encoded as fmt: JPEG (coded as
        jpeg_variant says), PNG or WEBP."""
        from PIL import Image, ImageFilter

        rng = np.random.default_rng([seed, i])
        w, h = image_shape(i, rng)
        src = self.scenes[int(rng.integers(SCENES))]
        sw, sh = src.size
        aspect = w / h
        area = rng.uniform(0.3, 1.0) * sw * sh  # a random crop of the scene at the image's aspect ratio
        cw = min(sw, math.sqrt(area * aspect))
        ch = cw / aspect
        if ch > sh:
            ch, cw = sh, sh * aspect
        x0, y0 = rng.uniform(0, sw - cw), rng.uniform(0, sh - ch)
        im = src.resize((w, h), Image.BICUBIC, box=(x0, y0, x0 + cw, y0 + ch))
        im = im.filter(ImageFilter.UnsharpMask(radius=2, percent=SHARPEN_PERCENT, threshold=0))
        a = np.asarray(im, dtype=np.float32)
        if rng.random() < 0.5:
            a = a[:, ::-1]
        grey = a.mean(axis=2, keepdims=True)
        a = grey + (a - grey) * rng.uniform(0.6, 1.4)  # saturation
        a = (a - 128.0) * rng.uniform(0.75, 1.25) + 128.0 + rng.uniform(-25, 25)  # contrast, brightness
        a = a * rng.uniform(0.85, 1.15, 3).astype(np.float32)  # white balance
        a += self._grain(rng, h, w)
        buf = io.BytesIO()
        jpeg = dict(quality=JPEG_QUALITY, subsampling="4:2:0" if variant in ("gray", "progressive") else variant,
                    progressive=variant == "progressive")
        options = {"JPEG": jpeg, "PNG": {}, "WEBP": dict(quality=WEBP_QUALITY)}[fmt]
        out = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))
        (out.convert("L") if fmt == "JPEG" and variant == "gray" else out).save(buf, format=fmt, **options)
        return buf.getvalue(), w, h


def jpeg_variant(i: int, kind: str) -> str:
    """How image i of a JPEG corpus is coded. "imagenet": ImageNet's kinds of JPEG, in shares near its
    training set's (mostly 4:2:0 baseline; some 4:4:4, 4:2:2, grayscale and progressive files), so that
    a decoder's share of what it cannot take shows; every other kind: 4:2:0 baseline."""
    if kind != "imagenet":
        return "4:2:0"
    k = i % 100
    return "gray" if k < 2 else "progressive" if k < 4 else "4:2:2" if k < 7 else "4:4:4" if k < 12 else "4:2:0"


def image_format(i: int, kind: str) -> str:
    """The format of image i in a corpus of that kind."""
    if kind == "png":
        return "PNG"
    if kind == "mixed":
        return {3: "PNG", 13: "WEBP"}.get(i % 20, "JPEG")
    return "JPEG"


def image_relpath(i: int, kind: str = "jpeg") -> str:
    return os.path.join(f"class_{i % CLASSES:02d}", f"img_{i:05d}{_EXTENSIONS[image_format(i, kind)]}")


def corpus_facts(files: list[tuple[int, int, int]], seconds: float, grain: float, kind: str = "jpeg") -> dict:
    """Count, formats, size groups, mean KB and bits per pixel from (width, height, bytes) per image."""
    groups: dict[str, list] = {}
    for w, h, nbytes in files:
        groups.setdefault(size_group(w, h), []).append((w * h, nbytes))
    order = ["500x375", "375x500", "500x333", "~400x400", "1600x1200", "3000x2000"]
    g = {}
    for name in order:
        if name in groups:
            px = sum(p for p, _ in groups[name])
            b = sum(x for _, x in groups[name])
            g[name] = {"count": len(groups[name]), "mean_kb": b / len(groups[name]) / 1e3, "bpp": 8 * b / px}
    total_b = sum(x for _, _, x in files)
    total_px = sum(w * h for w, h, _ in files)
    typical = [x for w, h, x in files if size_group(w, h) not in ("1600x1200", "3000x2000")]
    formats: dict[str, int] = {}
    variants: dict[str, int] = {}
    for i in range(len(files)):
        formats[image_format(i, kind)] = formats.get(image_format(i, kind), 0) + 1
        if image_format(i, kind) == "JPEG":
            variants[jpeg_variant(i, kind)] = variants.get(jpeg_variant(i, kind), 0) + 1
    return {"count": len(files), "kind": kind, "formats": formats, "classes": CLASSES, "groups": g,
            "total_mb": total_b / 1e6,
            "mean_kb": total_b / len(files) / 1e3,
            "mean_kb_typical": sum(typical) / len(typical) / 1e3 if typical else float("nan"),
            "bpp": 8 * total_b / total_px, "generate_seconds": seconds, "grain_sigma": grain,
            "grain_chroma": GRAIN_CHROMA, "sharpen_percent": SHARPEN_PERCENT, "jpeg_quality": JPEG_QUALITY,
            "webp_quality": WEBP_QUALITY,
            "jpeg_variants": variants, "source": SOURCE,
            "version": CORPUS_VERSION}


def ensure_corpus(c: Corpus, n: int, seed: int, grain: float, threads: int, out, kind: str = "jpeg") -> dict:
    """The tree (made when its marker is missing or names another count), its packed copy, and
    fastpipe.ImageFolder's scan of it (kept under ``c.index``, so that no case process scans)."""
    import warnings

    import fastpipe

    facts = None
    try:
        with open(c.facts_path) as f:
            facts = json.load(f)
        if facts.get("count") != n or facts.get("version") != CORPUS_VERSION:
            facts = None
    except (OSError, ValueError):
        pass
    if facts is None:
        if os.path.exists(c.facts_path):
            os.remove(c.facts_path)
        shutil.rmtree(c.tree, ignore_errors=True)
        shutil.rmtree(c.packed, ignore_errors=True)
        shutil.rmtree(c.index, ignore_errors=True)
        for p in (c.beton, c.beton + ".partial"):
            if os.path.exists(p):
                os.remove(p)
        for k in range(CLASSES):
            os.makedirs(os.path.join(c.tree, f"class_{k:02d}"), exist_ok=True)
        out.log(f"  generating {n} images ({kind}) in {c.tree} ...")
        t0 = time.perf_counter()
        painter = _Painter(grain, seed)
        made = [None] * n

        def one(i):
            data, w, h = painter.encode(i, seed, image_format(i, kind), jpeg_variant(i, kind))
            with open(os.path.join(c.tree, image_relpath(i, kind)), "wb") as f:
                f.write(data)
            made[i] = (w, h, len(data))

        # Threads: Pillow's resize, filter and encoder and numpy's big operations release the GIL.
        with concurrent.futures.ThreadPoolExecutor(max(1, threads)) as pool, \
                out.progress(total=n, desc="corpus", unit="img") as bar:
            for fut in [pool.submit(one, i) for i in range(n)]:
                fut.result()
                bar.update()
        os.sync()  # dirty pages cannot be evicted: the cold passes need the files on disk
        facts = corpus_facts(made, time.perf_counter() - t0, grain, kind)
        bc.write_json(facts, c.facts_path)  # last: the marker of a whole corpus
        out.log(f"  generated {n} images ({facts['total_mb']:.0f} MB) in {facts['generate_seconds']:.1f} s")
    folder = fastpipe.ImageFolder(c.tree, cache_dir=c.index)
    packed_ok = False
    try:
        with open(os.path.join(c.packed, "meta.json")) as f:
            packed_ok = json.load(f).get("num_images") == n
    except (OSError, ValueError):
        pass
    if not packed_ok:
        shutil.rmtree(c.packed, ignore_errors=True)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fastpipe.write_images(folder, c.packed, progress=out.show_progress and sys.stderr.isatty())
        facts["pack_seconds"] = time.perf_counter() - t0
        os.sync()
        bc.write_json(facts, c.facts_path)
    facts["packed_mb"] = os.path.getsize(os.path.join(c.packed, "images.bin")) / 1e6
    return facts
