"""write_images: packs images (a folder, or a dataset of encoded bytes or paths) into an ImageDataset."""

import io
import json
import numbers
import os
import warnings

import numpy as np
import torch

from fastpipe import _checks as checks
from fastpipe._ext import _C
from fastpipe.data.images import _PACKED_FILES as _FILES, _PACKED_FORMAT, ImageDataset, ImageFolder
from fastpipe.data.writer import _fsync, _Progress


def _records(source):
    """(number of records, classes, a function i -> (data or path, label, name for messages))."""
    if isinstance(source, (str, bytes, os.PathLike)):
        with warnings.catch_warnings():  # its bad files are converted or listed below, with one warning
            warnings.simplefilter("ignore")
            source = ImageFolder(os.fsdecode(source))
    if isinstance(source, ImageFolder):
        labels = source.targets
        return len(source), list(source.classes), lambda i: (source._path(i), labels[i], source._path(i))
    samples = getattr(source, "samples", None)
    if isinstance(samples, list) and samples and isinstance(samples[0], tuple) and len(samples[0]) == 2:
        # torchvision's ImageFolder/DatasetFolder: its (path, class) list, without decoding anything.
        classes = list(getattr(source, "classes", [])) or None
        return len(samples), classes, lambda i: (samples[i][0], samples[i][1], samples[i][0])
    if not (hasattr(source, "__len__") and hasattr(source, "__getitem__")):
        raise TypeError(f"source must be an image folder's path, a fastpipe.ImageFolder, or a map-style dataset of "
                        f"(encoded bytes or path, label) items, got {type(source).__name__}")
    classes = list(getattr(source, "classes", [])) or None

    def item(i):
        try:
            it = source[i]
        except BaseException as e:
            if hasattr(e, "add_note"):
                e.add_note(f"write_images: raised by source[{i}]")
            raise
        if not isinstance(it, (tuple, list)) or len(it) != 2:
            raise TypeError(f"write_images: item {i} must be (encoded bytes or path, label), got "
                            f"{type(it).__name__}")
        return it[0], it[1], f"item {i}"
    return len(source), classes, item


def _encoded(data, name):
    """The bytes of an item's image: read from a path, or the item's own bytes."""
    if isinstance(data, (str, os.PathLike)):
        with open(data, "rb") as f:
            return f.read()
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 1:
        return data.tobytes()
    if isinstance(data, torch.Tensor) and data.dtype == torch.uint8 and data.dim() == 1:
        return data.cpu().numpy().tobytes()
    raise TypeError(f"write_images: {name}: the image must be its encoded bytes (bytes, or a 1-D uint8 array or "
                    f"tensor) or a path to its file, got {type(data).__name__} (decoded images are not packed: "
                    f"give the files)")


def _to_png(data):
    """``data`` (any format Pillow opens) as Pillow's ``convert("RGB")`` of it, losslessly in a PNG, or the
    reason it cannot be."""
    try:
        from PIL import Image
    except ImportError:
        return None, "Pillow is not installed to convert it"
    try:
        with Image.open(io.BytesIO(data)) as im:
            rgb = im.convert("RGB")
        out = io.BytesIO()
        rgb.save(out, format="PNG", compress_level=1)
        return out.getvalue(), None
    except Exception as e:  # Pillow raises many types for undecodable data
        return None, f"Pillow cannot decode it either ({type(e).__name__}: {e})"


# Formats the reader threads decode: packed as they are.
_KEPT = ("JPEG", "PNG", "WebP")


def _packable(data):
    """(bytes to pack, header info, why they were converted or None), or (None, None, why not)."""
    try:
        info = _C.image_info(data)
        if info["format"] in _KEPT and not info.get("animated"):
            return data, info, None
        why = f"{info.get('sniffed') or 'an unknown format'}, decoded by Pillow"
    except ValueError as e:
        why = str(e)
    converted, fail = _to_png(data)
    if converted is None:
        return None, None, f"{why}; {fail}"
    return converted, _C.image_info(converted), why


def write_images(source, out_dir, *, progress=True):
    """Packs images into ``out_dir`` and returns the :class:`ImageDataset` that reads them.

    Parameters
    ----------
    source : path, ImageFolder, or map-style dataset
        An ImageFolder tree (``root/<class>/<file>.jpg``, any format) by path or as :class:`fastpipe.ImageFolder` (or
        torchvision's, whose ``samples`` are used without decoding anything); or a dataset whose items are
        ``(image, label)``: the image as its encoded bytes or a path to its file, the label an int.
        ``source.classes`` names the labels when it has one.
    out_dir : path
        Created if missing. Holds ``images.bin`` (the images' original bytes back to back), ``offsets.npy``
        (int64, N + 1), ``heights.npy`` and ``widths.npy`` (int32, from the headers), ``labels.npy`` (int64)
        and ``meta.json`` (classes, what was converted or skipped and why). Each file is written under a
        temporary name, synced and renamed; ``meta.json`` last, so a folder without it is incomplete.
    progress : bool
        Show a progress bar (tqdm when installed).

    Notes
    -----
    JPEG, PNG and WebP files are copied byte for byte, never re-encoded (the reader threads decode them,
    to RGB as Pillow does). Any other image Pillow reads (BMP, GIF, TIFF, an animated WebP, a 12-bit
    JPEG) is stored as Pillow's ``convert("RGB")`` of it in a PNG, losslessly, and listed in
    ``meta["converted"]``; one that Pillow cannot read either (truncated, garbage) is left out and listed
    in ``meta["skipped"]`` with the reason. A summary warning names the first of each.
    """
    out_dir = os.path.abspath(checks.path(out_dir, "out_dir"))
    progress = checks.flag(progress, "progress")
    n, classes, item = _records(source)
    if n == 0:
        raise ValueError("write_images: the source is empty; nothing was written")
    for name in _FILES + ("meta.json",):
        if os.path.isdir(os.path.join(out_dir, name)):
            raise IsADirectoryError(f"write_images: '{os.path.join(out_dir, name)}' is a directory")
    created = not os.path.isdir(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    tmp = {name: os.path.join(out_dir, name + ".partial") for name in _FILES + ("meta.json",)}
    offsets, heights, widths, labels = [0], [], [], []
    converted, skipped = [], []
    bar = _Progress(n, progress, desc="write_images", unit="images")
    try:
        with open(tmp["images.bin"], "wb") as out:
            for i in range(n):
                data, label, name = item(i)
                if isinstance(label, bool) or not isinstance(label, numbers.Integral) and not (
                        isinstance(label, torch.Tensor) and label.numel() == 1 and not label.is_floating_point()):
                    raise TypeError(f"write_images: {name}: the label must be an int, got {type(label).__name__}")
                data, info, why = _packable(_encoded(data, name))
                if data is None:
                    skipped.append({"index": i, "name": str(name), "reason": why})
                    bar.update(1)
                    continue
                if why is not None:
                    converted.append({"index": i, "name": str(name), "reason": why})
                out.write(data)
                offsets.append(offsets[-1] + len(data))
                heights.append(info["height"])
                widths.append(info["width"])
                labels.append(int(label))
                bar.update(1)
        if not labels:
            raise ValueError(f"write_images: none of the {n} images could be packed (e.g. {skipped[0]['name']}: "
                             f"{skipped[0]['reason']})")
        if classes is None:
            classes = [str(c) for c in range(max(labels) + 1)]
        for name, values, dtype in (("offsets.npy", offsets, np.int64), ("heights.npy", heights, np.int32),
                                    ("widths.npy", widths, np.int32), ("labels.npy", labels, np.int64)):
            with open(tmp[name], "wb") as f:
                np.save(f, np.asarray(values, dtype))
        meta = {"format": _PACKED_FORMAT, "num_images": len(labels), "classes": [str(c) for c in classes],
                "source_images": n, "converted": converted, "skipped": skipped}
        with open(tmp["meta.json"], "w") as f:
            json.dump(meta, f, indent=1)
        for path in tmp.values():
            _fsync(path)
        # Without meta.json the folder reads as incomplete until every data file is in place.
        if os.path.exists(os.path.join(out_dir, "meta.json")):
            os.remove(os.path.join(out_dir, "meta.json"))
        for name in _FILES + ("meta.json",):
            os.replace(tmp[name], os.path.join(out_dir, name))
        _fsync(out_dir, directory=True)
    except BaseException:
        for path in tmp.values():
            try:
                os.remove(path)
            except OSError:
                pass
        if created:
            try:
                os.rmdir(out_dir)
            except OSError:
                pass
        raise
    finally:
        bar.close()
    if converted or skipped:
        parts = []
        if converted:
            parts.append(f"{len(converted)} converted to PNG (e.g. {converted[0]['name']}: {converted[0]['reason']})")
        if skipped:
            parts.append(f"{len(skipped)} left out (e.g. {skipped[0]['name']}: {skipped[0]['reason']})")
        warnings.warn(f"write_images: of {n} images, {'; '.join(parts)}; meta.json lists them", stacklevel=2)
    return ImageDataset(out_dir)
