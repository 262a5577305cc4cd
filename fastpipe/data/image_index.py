"""An image folder's index: its files (torchvision's listing of the tree, or a sample list given), each
file's format and size from its header, and its label.

The index is kept under a cache folder (one per root), so that a restart reads no header again while
no folder of the tree changed (their modification times); when one did, only the files whose size or
modification time changed are read again. A file rewritten in place (its folder unchanged) is still
read right: the readers draw each crop from the header they read with the record.
"""

import hashlib
import json
import os
import shutil
import tempfile
import warnings

import numpy as np

from fastpipe._cache_home import cache_home
from fastpipe._ext import _C
from fastpipe.data import _pillow

# torchvision's ImageFolder extensions: the same files, in the same order, with the same labels.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_INDEX_FORMAT = "fastpipe.ImageFolder/3"
_PER_FILE = ("heights", "widths", "formats", "bytes", "mtimes")  # what the scan reads of each file
_ARRAYS = ("name_offsets", "labels") + _PER_FILE
# Formats the reader threads hand to Pillow: their sizes come from Pillow too.
_PILLOW_FORMATS = (_C.IMAGE_FORMATS.index("other"), _C.IMAGE_FORMATS.index("unknown"))
CACHE_ENV = "FASTPIPE_IMAGE_CACHE"


def default_cache():
    return os.environ.get(CACHE_ENV) or cache_home("image_folders")


def list_folder(root):
    """torchvision's listing of ``root``: (classes, relative file names as bytes, labels, the folders
    walked relative to root)."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    if not classes:
        raise FileNotFoundError(f"ImageFolder: no class folder in '{root}' (expected root/<class>/<image>)")
    names, labels, empty, dirs = [], [], [], ["."]  # the root: a new class folder changes its time
    for ci, c in enumerate(classes):
        found = len(names)
        for dirpath, _, fnames in sorted(os.walk(os.path.join(root, c), followlinks=True)):
            rel = os.path.relpath(dirpath, root)
            dirs.append(rel)
            prefix = os.fsencode(rel) + b"/"  # one relpath per folder: per file it costs more than the walk
            found_here = [prefix + os.fsencode(f) for f in sorted(fnames) if f.lower().endswith(IMG_EXTENSIONS)]
            names += found_here
            labels += [ci] * len(found_here)
        if len(names) == found:
            empty.append(c)
    if empty:
        raise FileNotFoundError(f"ImageFolder: no image file in the class folder(s) {empty[:5]} of '{root}' "
                                f"(extensions {', '.join(IMG_EXTENSIONS)}), as torchvision's ImageFolder requires")
    return classes, names, labels, dirs


def _blob(names):
    offsets = np.zeros(len(names) + 1, np.int64)
    np.cumsum([len(n) for n in names], out=offsets[1:])
    return b"".join(names), offsets


def _dir_times(root, dirs):
    """{folder relative to root: mtime_ns} (-1: gone)."""
    out = {}
    for rel in sorted(set(dirs)):
        try:
            out[rel] = os.stat(os.path.join(root, rel)).st_mtime_ns
        except OSError:
            out[rel] = -1
    return out


def _dirs_unchanged(root, dirs):
    return _dir_times(root, dirs) == dirs


def _index_dir(cache, root, list_digest=b""):
    """One index per root for its listing, and one per sample list (lists of one root never overwrite
    each other's)."""
    key = os.fsencode(root) + (b"\0" + list_digest if list_digest else b"")
    return os.path.join(cache, hashlib.sha256(key).hexdigest()[:20])


def load_or_scan(root, *, names=None, labels=None, classes=None, cache=None, rescan=False, threads=4):
    """The index of ``root`` (a dict), and whether headers were read for it.

    ``names``/``labels``/``classes``: the sample list (file names relative to root, as bytes); None: the
    tree is listed as torchvision does. ``cache``: the cache folder, or "off".
    """
    cache = default_cache() if cache is None else cache
    listed = names is None
    if listed:
        index_dir = None if cache == "off" else _index_dir(cache, root)
        previous = None if index_dir is None else _load(index_dir, root)
        if previous is not None and not rescan and _dirs_unchanged(root, previous["dirs"]):
            return previous, False
        classes, names, labels, dirs = list_folder(root)
    else:
        dirs = {os.fsdecode(os.path.dirname(n)) or "." for n in names}
    blob, offsets = _blob(names)
    labels = np.asarray(labels, np.int64)
    if not listed:
        digest = hashlib.sha256(blob + labels.tobytes() + "\0".join(classes).encode()).digest()
        index_dir = None if cache == "off" else _index_dir(cache, root, digest)
        previous = None if index_dir is None else _load(index_dir, root)
        if (previous is not None and not rescan and previous["names"] == blob
                and np.array_equal(previous["labels"], labels) and previous["classes"] == list(classes)
                and _dirs_unchanged(root, previous["dirs"])):
            return previous, False
        if previous is None and index_dir is not None:
            previous = _load(_index_dir(cache, root), root)  # the folder's own index: headers of unchanged files
    index = _scan(root, blob, offsets, threads, None if rescan else previous)
    index.update(root=root, classes=list(classes), labels=labels, dirs=_dir_times(root, dirs))
    try:
        if index_dir is not None:
            _save(index, index_dir)
    except OSError as e:
        warnings.warn(f"ImageFolder: cannot keep its index under '{cache}' ({e}); the folder will be scanned again "
                      f"next time (set cache_dir= or ${CACHE_ENV})", stacklevel=3)
    return index, True


def _scan(root, blob, offsets, threads, previous):
    """Headers of the files: those unchanged since ``previous`` (same name, size and mtime) taken from it."""
    n = len(offsets) - 1
    index = {"names": blob, "name_offsets": offsets, "heights": np.zeros(n, np.int32),
             "widths": np.zeros(n, np.int32), "formats": np.zeros(n, np.int8), "bytes": np.full(n, -1, np.int64),
             "mtimes": np.full(n, -1, np.int64)}
    bad = {}
    todo = np.arange(n)
    if previous is not None and n:
        size, mtime = _C.stat_image_files(root, blob, offsets, threads)
        at = _positions(previous, blob, offsets)
        prev_bad = dict(previous["bad"])
        safe = np.maximum(at, 0)
        keep = (at >= 0) & (size >= 0) & (previous["bytes"][safe] == size) & (previous["mtimes"][safe] == mtime)
        for k in _PER_FILE:
            index[k][keep] = previous[k][at[keep]]
        bad = {int(i): prev_bad[int(at[i])] for i in np.flatnonzero(keep) if int(at[i]) in prev_bad}
        todo = np.flatnonzero(~keep)
    if len(todo):
        sub_blob, sub_offsets = _blob([blob[offsets[i]:offsets[i + 1]] for i in todo]) if len(todo) < n else (
            blob, offsets)
        scan = _C.scan_image_files(root, sub_blob, sub_offsets, threads)
        for k in _PER_FILE:
            index[k][todo] = scan[k]
        bad.update({int(todo[i]): why for i, why in zip(scan["bad"], scan["reasons"])})
        # Sizes of the formats Pillow decodes, as Pillow reads them (it says what it cannot read).
        for i in todo[np.isin(index["formats"][todo], _PILLOW_FORMATS)]:
            if int(i) in bad:
                continue
            path = os.path.join(root, os.fsdecode(blob[offsets[i]:offsets[i + 1]]))
            h, w, why = _pillow.image_size(path)
            if why is None:
                index["heights"][i], index["widths"][i] = h, w
            else:
                what = _C.IMAGE_FORMATS[index["formats"][i]]
                bad[int(i)] = ("not an image format this library knows" if what == "unknown" else
                               "a format decoded by Pillow") + f"; {why}"
    index["bad"] = sorted(bad.items())
    return index


def _positions(previous, blob, offsets):
    """For each file, its position in ``previous`` (-1: not there)."""
    if previous["names"] == blob:
        return np.arange(len(offsets) - 1)
    po, pb = previous["name_offsets"], previous["names"]
    where = {pb[po[i]:po[i + 1]]: i for i in range(len(po) - 1)}
    return np.array([where.get(blob[offsets[i]:offsets[i + 1]], -1) for i in range(len(offsets) - 1)], np.int64)


def _load(index_dir, root):
    """The cached index of ``root``, or None (missing, partial or from another version)."""
    try:
        with open(os.path.join(index_dir, "index.json")) as f:
            meta = json.load(f)
        if meta.get("format") != _INDEX_FORMAT or meta.get("root") != root:
            return None
        with open(os.path.join(index_dir, "names.bin"), "rb") as f:
            names = f.read()
        index = dict(meta, names=names, bad=[(int(i), why) for i, why in meta["bad"]])
        for k in _ARRAYS:
            index[k] = np.load(os.path.join(index_dir, f"{k}.npy"))
        n = meta["num_images"]
        if len(index["name_offsets"]) != n + 1 or int(index["name_offsets"][-1]) != len(names) or any(
                len(index[k]) != n for k in _ARRAYS[1:]):
            return None
        return index
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _save(index, index_dir):
    save_folder(index_dir, lambda folder: _write(index, folder))


def save_folder(index_dir, write):
    """Makes ``index_dir`` with ``write(folder)``, all or nothing: a folder written under a temporary name and
    renamed into place (OSError when the cache cannot be written)."""
    parent = os.path.dirname(index_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(index_dir) + ".partial-", dir=parent)
    try:
        write(tmp)
        if os.path.isdir(index_dir):
            shutil.rmtree(index_dir, ignore_errors=True)
        os.rename(tmp, index_dir)
    except OSError:
        # Another process (a DDP rank) put its index there first: it is the same scan.
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.isdir(index_dir):
            raise


def _write(index, folder):
    with open(os.path.join(folder, "names.bin"), "wb") as f:
        f.write(index["names"])
    for k in _ARRAYS:
        np.save(os.path.join(folder, f"{k}.npy"), index[k])
    meta = {"format": _INDEX_FORMAT, "root": index["root"], "classes": index["classes"], "dirs": index["dirs"],
            "num_images": len(index["name_offsets"]) - 1, "bad": index["bad"]}
    with open(os.path.join(folder, "index.json"), "w") as f:  # last: its presence marks a whole index
        json.dump(meta, f)
