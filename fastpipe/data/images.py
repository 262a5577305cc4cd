"""Image datasets: JPEG files read in place (ImageFolder) or packed into one file (ImageDataset).

Both yield ``(image, label)`` batches: the image decoded and transformed by a JPEG transform
(:class:`fastpipe.transforms.RandomResizedCrop` or :class:`~fastpipe.transforms.CenterCrop`) in the
reader threads, the label an int64. The images' sizes are known before they are decoded (read from
their headers when the folder is scanned or the records packed), so each crop is drawn first and only
its rows and columns are decoded.
"""

import hashlib
import json
import os
import shutil
import tempfile
import warnings
import weakref

import numpy as np
import torch

from fastpipe import _checks as checks
from fastpipe._ext import _C
from fastpipe.data._source import ColumnSource

# torchvision's ImageFolder extensions: the same files, in the same order, with the same labels.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
DEFAULT_MAX_RECORD_BYTES = 64 << 20
_INDEX_FORMAT = "fastpipe.ImageFolder/2"
_PACKED_FORMAT = "fastpipe.ImageDataset/1"
_CACHE_ENV = "FASTPIPE_IMAGE_CACHE"


def _transforms_module():
    from fastpipe import transforms  # fastpipe.transforms imports nothing from fastpipe.data
    return transforms


def _check_transform(transform, name):
    if transform is None or isinstance(transform, _transforms_module()._JpegTransform):
        return transform
    hint = (" (torchvision transforms run in Python per image; fastpipe's run in the reader threads: use "
            "fastpipe.transforms.RandomResizedCrop or CenterCrop, which take the same arguments)"
            if type(transform).__module__.startswith("torchvision") else "")
    raise TypeError(f"{name} must be fastpipe.transforms.RandomResizedCrop or CenterCrop, got "
                    f"{type(transform).__name__}{hint}")


def _labels_column(path, n):
    h = _C.read_npy_header(path)
    if h["dtype"] != "int64" or tuple(h["shape"]) != (n,):
        raise ValueError(f"'{path}' must hold {n} int64 labels, has dtype {h['dtype']} shape {h['shape']}")
    return _C.ColumnSpec(path=path, data_offset=h["data_offset"], record_stride=8, record_bytes=8, num_records=n)


class _Images(ColumnSource):
    """What ImageFolder and ImageDataset share: ``(image, label)`` samples of JPEG records.

    Subclasses set ``_source`` (a ``_C.ImageSource``), ``_labels_path``, ``_where`` (for messages),
    ``classes``, ``image_sizes`` ((N, 2) heights and widths), ``transform`` and ``max_record_bytes``.
    """

    _unit = "images"
    _decodes_images = True

    def _init_common(self, transform, max_record_bytes):
        self.transform = _check_transform(transform, "transform")
        self.max_record_bytes = checks.integer(max_record_bytes, "max_record_bytes", low=1)

    @property
    def class_to_idx(self):
        return {c: i for i, c in enumerate(self.classes)}

    @property
    def targets(self):
        """The label of every sample (as torchvision's ``targets``)."""
        return np.load(self._labels_path, mmap_mode="r").tolist()

    def _reader_columns(self, transforms, seed, device_decode=False):
        transform = self.transform
        for field, t in transforms.items():
            if field not in (0, "image"):
                raise KeyError(f"transforms: {field!r} is not the image field of (image, label) batches: use 0 or "
                               f"'image'")
            transform = _check_transform(t, f"transforms[{field!r}]")
        if transform is None:
            raise ValueError(f"{type(self).__name__} needs a transform that makes every image the same size (its "
                             f"images differ): pass transform=fastpipe.transforms.RandomResizedCrop(224) or "
                             f"CenterCrop(224, resize=256) to the dataset, or transforms={{0: ...}} to the Loader")
        budgets = {}
        if device_decode:
            # Per record in the host slot and on the device: twice the mean, so that most records fit
            # (those that do not are decoded on the host).
            pixels = self.image_sizes[:, 0].astype(np.int64) * self.image_sizes[:, 1]
            budgets = dict(device_decode=True,
                           encoded_budget=int(min(self.max_record_bytes, max(256 << 10, 2 * self._mean_bytes()))),
                           pixel_budget=int(max(512 * 512, 2 * pixels.mean())))
        image = _C.ImageColumnSpec(self._source, transform._image_params(seed), self.max_record_bytes, **budgets)
        n = len(self)
        columns = [_C.ColumnSpec(path=self._where, data_offset=0, record_stride=0, record_bytes=0, num_records=n,
                                 image=image),
                   _labels_column(self._labels_path, n)]
        return columns, [transform._output(), ("int64", [])]

    def _pack(self, tensors):
        return tensors[0], tensors[1]

    def __getitem__(self, i):
        """``(image, label)``: the dataset's transform of sample ``i`` in epoch 0 with seed 0, or without a
        transform the whole image decoded, uint8 of shape (height, width, 3). For inspection: the Loader
        reads batches in C++ threads."""
        i = self._index(i)
        transform = self.transform
        if transform is None:
            h, w = (int(v) for v in self.image_sizes[i])
            if h == 0:
                raise ValueError(f"image {self._source.describe(i)}: {self._bad_reason(i)}")
            transform = _transforms_module().CenterCrop((h, w), out_dtype=torch.uint8, layout="NHWC",
                                                         dct_scaling=False)
        spec = _C.ImageColumnSpec(self._source, transform._image_params(0), self.max_record_bytes)
        label = int(np.load(self._labels_path, mmap_mode="r")[i])
        return spec._read(i, 0), label

    def _bad_reason(self, i):
        return "its header could not be read"

    def _mean_bytes(self):
        raise NotImplementedError


class ImageFolder(_Images):
    """A folder of JPEG images, ``root/<class>/<...>/<file>.jpg``, read in place.

    The classes, sample order and labels are torchvision's ``ImageFolder``'s (class folders sorted by
    name, files sorted within them, torchvision's image extensions), so indices and labels agree with it.

    Parameters
    ----------
    root : path
    transform : RandomResizedCrop or CenterCrop, optional
        How images become batch-sized (the Loader's ``transforms={0: ...}`` overrides it).
    cache_dir : path, optional
        Where the scan (file list, each image's size from its header, labels) is kept, so that a restart
        does not scan again. Default: ``$FASTPIPE_IMAGE_CACHE`` or ``~/.cache/fastpipe/image_folders``;
        ``"off"``: a temporary index for this process only. The index is reused while no folder of the
        tree changed (their modification times); ``rescan=True`` forces a new scan.
    rescan : bool
    num_threads : int, optional
        Threads reading headers during a scan (default: the cores, at least 4: they mostly wait on the disk).
    max_record_bytes : int
        An image file larger than this is an error naming it (64 MiB).

    Notes
    -----
    Files that are not JPEGs this library decodes (a PNG, even under a .jpg name; a 12-bit or lossless
    JPEG) stay in the sample list, so indices match torchvision's, and are listed in ``bad`` with the
    reason, with a warning: the Loader raises on them (``on_error="raise"``) or substitutes other samples
    (``on_error="replace"``); :func:`fastpipe.write_images` converts them when it packs the folder.
    Grayscale and CMYK JPEGs are decoded to RGB as PIL's ``convert("RGB")`` does. EXIF orientation is
    not applied (as torchvision's ImageFolder, which opens images with PIL, does not).
    """

    def __init__(self, root, transform=None, *, cache_dir=None, rescan=False, num_threads=None,
                 max_record_bytes=DEFAULT_MAX_RECORD_BYTES):
        self.root = os.path.abspath(checks.path(root, "root"))
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"ImageFolder: '{self.root}' is not a directory")
        self._init_common(transform, max_record_bytes)
        rescan = checks.flag(rescan, "rescan")
        threads = max(4, os.cpu_count() or 1) if num_threads is None else checks.integer(num_threads, "num_threads",
                                                                                         low=1)
        cache = os.environ.get(_CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "fastpipe",
                                                             "image_folders")
        cache = cache if cache_dir is None else checks.path(cache_dir, "cache_dir")
        key = hashlib.sha256(os.fsencode(self.root)).hexdigest()[:20]
        index_dir = None if cache == "off" else os.path.join(cache, key)
        index = None if rescan or index_dir is None else _load_index(index_dir, self.root)
        self.rescanned = index is None
        if index is None:
            index = _scan(self.root, threads)
            try:
                if index_dir is not None:
                    _save_index(index, index_dir)
            except OSError as e:
                warnings.warn(f"ImageFolder: cannot keep its index under '{cache}' ({e}); the folder will be "
                              f"scanned again next time (set cache_dir= or ${_CACHE_ENV})", stacklevel=2)
                index_dir = None
            if index_dir is None:  # an index for this process only
                index_dir = tempfile.mkdtemp(prefix="fastpipe-imagefolder-")
                weakref.finalize(self, shutil.rmtree, index_dir, True)
                _write_index(index, index_dir)
        self._index_dir = index_dir
        self.classes = index["classes"]
        self._names, self._name_offsets = index["names"], index["name_offsets"]
        self.image_sizes = np.stack([index["heights"], index["widths"]], axis=1)
        self._len = len(self._name_offsets) - 1
        self._labels_path = os.path.join(index_dir, "labels.npy")
        self._where = self.root
        self.bad = [(i, self._path(i), why) for i, why in index["bad"]]
        self._file_bytes = index["bytes"]
        self._source = _C.ImageSource.folder(self.root, self._names, self._name_offsets, index["heights"],
                                             index["widths"])
        if self.bad:
            i, path, why = self.bad[0]
            warnings.warn(f"ImageFolder('{self.root}'): {len(self.bad)} of {self._len} files are not JPEGs this "
                          f"library decodes (e.g. '{path}': {why}); see .bad. The Loader raises on them "
                          f"(on_error='raise') or replaces them with other samples (on_error='replace'); "
                          f"fastpipe.write_images converts them when it packs the folder.", stacklevel=2)

    def _path(self, i):
        name = self._names[self._name_offsets[i]:self._name_offsets[i + 1]]
        return os.path.join(self.root, os.fsdecode(name))

    def _bad_reason(self, i):
        return dict((j, why) for j, _, why in self.bad).get(i, "its header could not be read")

    def _mean_bytes(self):
        return float(np.maximum(self._file_bytes, 0).mean())

    @property
    def samples(self):
        """``[(path, class_index)]`` (as torchvision's ``samples``)."""
        return list(zip((self._path(i) for i in range(self._len)), self.targets))

    imgs = samples

    def __repr__(self):
        return (f"ImageFolder('{self.root}': {self._len} images, {len(self.classes)} classes, "
                f"transform={self.transform!r})")


class ImageDataset(_Images):
    """JPEG records packed by :func:`fastpipe.write_images`: one file of the original JPEG bytes, their
    offsets, sizes and labels, and the class list.

    Parameters
    ----------
    path : path
        The folder write_images wrote.
    transform : RandomResizedCrop or CenterCrop, optional
        As ImageFolder's.
    max_record_bytes : int
        As ImageFolder's.
    """

    def __init__(self, path, transform=None, *, max_record_bytes=DEFAULT_MAX_RECORD_BYTES):
        self.path = os.path.abspath(checks.path(path, "path"))
        self._init_common(transform, max_record_bytes)
        meta_path = os.path.join(self.path, "meta.json")
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(f"'{self.path}' holds no meta.json: not a folder written by "
                                    f"fastpipe.write_images (or the write did not finish)") from None
        if meta.get("format") != _PACKED_FORMAT:
            raise ValueError(f"'{meta_path}' is not a fastpipe.ImageDataset (format {meta.get('format')!r})")
        self.meta = meta
        self.classes = list(meta["classes"])
        offsets = np.load(os.path.join(self.path, "offsets.npy"))
        heights = np.load(os.path.join(self.path, "heights.npy"))
        widths = np.load(os.path.join(self.path, "widths.npy"))
        n = int(meta["num_images"])
        if len(offsets) != n + 1 or len(heights) != n or len(widths) != n:
            raise ValueError(f"'{self.path}': meta.json says {n} images but offsets.npy has {len(offsets)} entries, "
                             f"heights.npy {len(heights)}, widths.npy {len(widths)}")
        self._len = n
        self.image_sizes = np.stack([heights, widths], axis=1)
        self._labels_path = os.path.join(self.path, "labels.npy")
        self._where = os.path.join(self.path, "images.bin")
        self._source = _C.ImageSource.packed(self._where, offsets, heights, widths)
        self._offsets = offsets

    def _mean_bytes(self):
        return float(self._offsets[-1] - self._offsets[0]) / max(1, self._len)

    def __repr__(self):
        return (f"ImageDataset('{self.path}': {self._len} images, {len(self.classes)} classes, "
                f"transform={self.transform!r})")


# ---- ImageFolder's index: the scan and its cache ---------------------------------------------------------

def _scan(root, threads):
    """The folder's classes, files (relative names back to back), labels, header sizes and bad files."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    if not classes:
        raise FileNotFoundError(f"ImageFolder: no class folder in '{root}' (expected root/<class>/<image>)")
    names, labels, dirs, empty = [], [], {}, []
    for ci, c in enumerate(classes):
        found = len(names)
        for dirpath, _, fnames in sorted(os.walk(os.path.join(root, c), followlinks=True)):
            dirs[os.path.relpath(dirpath, root)] = os.stat(dirpath).st_mtime_ns
            for f in sorted(fnames):
                if f.lower().endswith(IMG_EXTENSIONS):
                    names.append(os.fsencode(os.path.relpath(os.path.join(dirpath, f), root)))
                    labels.append(ci)
        if len(names) == found:
            empty.append(c)
    if empty:
        raise FileNotFoundError(f"ImageFolder: no image file in the class folder(s) {empty[:5]} of '{root}' "
                                f"(extensions {', '.join(IMG_EXTENSIONS)}), as torchvision's ImageFolder requires")
    offsets = np.zeros(len(names) + 1, np.int64)
    np.cumsum([len(n) for n in names], out=offsets[1:])
    blob = b"".join(names)
    scan = _C.scan_image_files(root, blob, offsets, threads)
    return {"root": root, "classes": classes, "dirs": dirs, "names": blob, "name_offsets": offsets,
            "labels": np.asarray(labels, np.int64), "heights": scan["heights"], "widths": scan["widths"],
            "bytes": scan["bytes"],
            "bad": [(int(i), why) for i, why in zip(scan["bad"], scan["reasons"])]}


def _load_index(index_dir, root):
    """The cached index of ``root`` when no folder of it changed since, else None."""
    try:
        with open(os.path.join(index_dir, "index.json")) as f:
            meta = json.load(f)
        if meta.get("format") != _INDEX_FORMAT or meta.get("root") != root:
            return None
        if sorted(e.name for e in os.scandir(root) if e.is_dir()) != meta["classes"]:
            return None
        for rel, mtime in meta["dirs"].items():
            if os.stat(os.path.join(root, rel)).st_mtime_ns != mtime:
                return None
        with open(os.path.join(index_dir, "names.bin"), "rb") as f:
            names = f.read()
        index = dict(meta, names=names, bad=[tuple(b) for b in meta["bad"]])
        for k in ("name_offsets", "heights", "widths", "bytes"):
            index[k] = np.load(os.path.join(index_dir, f"{k}.npy"))
        if len(index["name_offsets"]) != meta["num_images"] + 1 or int(index["name_offsets"][-1]) != len(names):
            return None
        return index
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing, partial or from another version: scan again


def _save_index(index, index_dir):
    """Writes the index to ``index_dir``, all or nothing: a folder renamed into place (OSError when the
    cache cannot be written)."""
    parent = os.path.dirname(index_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(index_dir) + ".partial-", dir=parent)
    try:
        _write_index(index, tmp)
        if os.path.isdir(index_dir):
            shutil.rmtree(index_dir, ignore_errors=True)
        os.rename(tmp, index_dir)
    except OSError:
        # Another process (a DDP rank) put its index there first: it is the same scan.
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.isdir(index_dir):
            raise


def _write_index(index, folder):
    with open(os.path.join(folder, "names.bin"), "wb") as f:
        f.write(index["names"])
    for k in ("name_offsets", "heights", "widths", "labels", "bytes"):
        np.save(os.path.join(folder, f"{k}.npy"), index[k])
    meta = {"format": _INDEX_FORMAT, "root": index["root"], "classes": index["classes"], "dirs": index["dirs"],
            "num_images": len(index["name_offsets"]) - 1, "bad": index["bad"]}
    with open(os.path.join(folder, "index.json"), "w") as f:  # last: its presence marks a whole index
        json.dump(meta, f)
