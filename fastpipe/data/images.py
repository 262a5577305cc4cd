"""Image datasets: image files read in place (ImageFolder) or packed into one file (ImageDataset).

Both yield ``(image, label)`` batches: the image decoded and transformed by an image transform
(:class:`fastpipe.transforms.RandomResizedCrop` or :class:`~fastpipe.transforms.CenterCrop`) in the
reader threads, the label an int64. JPEG, PNG and WebP are decoded there without the GIL; any other
format torchvision's ImageFolder reads (BMP, GIF, TIFF, ...) by Pillow, holding the GIL for that image.
The images' sizes are known before they are decoded (read from their headers), so each crop is drawn
first and only the rows (and, for JPEG and WebP, the columns) it needs are decoded.
"""

import json
import os
import warnings

import numpy as np
import torch

from fastpipe import _checks as checks
from fastpipe._ext import _C
from fastpipe.data import _pillow, _scratch, image_index, remote
from fastpipe.data._source import ColumnSource

DEFAULT_MAX_RECORD_BYTES = 64 << 20
_PACKED_FORMAT = "fastpipe.ImageDataset/1"
# What write_images writes besides meta.json (which it writes last).
_PACKED_FILES = ("images.bin", "offsets.npy", "heights.npy", "widths.npy", "labels.npy")


def _transforms_module():
    from fastpipe import image_transforms  # imports nothing from fastpipe.data
    return image_transforms


def _sizes_said(sizes):
    """What an error says of a dataset's image sizes ((N, 2) heights and widths): two that differ, or the one
    size of all and the transform that batches them as they are."""
    if len(sizes) and (sizes == sizes[0]).all():
        h, w = (int(v) for v in sizes[0])
        return (f"every image is {h}x{w}: CenterCrop(({h}, {w}), out_dtype=torch.uint8) batches them as they are, "
                f"as uint8 3x{h}x{w}")
    k = int(np.argmax((sizes != sizes[0]).any(axis=1)))
    return f"its images differ: image 0 is {sizes[0][0]}x{sizes[0][1]}, image {k} {sizes[k][0]}x{sizes[k][1]}"


def _check_transform(transform, name):
    if transform is None or isinstance(transform, _transforms_module()._JpegTransform):
        return transform
    hint = (" (torchvision transforms run in Python per image; fastpipe's run in the reader threads: use "
            "fastpipe.transforms.RandomResizedCrop, CenterCrop or RandomCrop, which take the same arguments)"
            if type(transform).__module__.startswith("torchvision") else "")
    raise TypeError(f"{name} must be fastpipe.transforms.RandomResizedCrop, CenterCrop or RandomCrop, got "
                    f"{type(transform).__name__}{hint}")


def _labels_column(path, n):
    h = _C.read_npy_header(path)
    if h["dtype"] != "int64" or tuple(h["shape"]) != (n,):
        raise ValueError(f"'{path}' must hold {n} int64 labels, has dtype {h['dtype']} shape {h['shape']}")
    return _C.ColumnSpec(path=path, data_offset=h["data_offset"], record_stride=8, record_bytes=8, num_records=n)


class _Images(ColumnSource):
    """What ImageFolder and ImageDataset share: ``(image, label)`` samples of encoded images.

    Subclasses set ``_source`` (a ``_C.ImageSource``), ``_labels_path``, ``_where`` (for messages),
    ``classes``, ``image_sizes`` ((N, 2) heights and widths), ``transform`` and ``max_record_bytes``.
    """

    _unit = "images"
    _decodes_images = True

    def _init_common(self, transform, max_record_bytes, target_transform):
        self.transform = _check_transform(transform, "transform")
        self.max_record_bytes = checks.integer(max_record_bytes, "max_record_bytes", low=1)
        if target_transform is not None and not callable(target_transform):
            raise TypeError(f"target_transform must be callable, got {type(target_transform).__name__}")
        self.target_transform = target_transform

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
            raise ValueError(f"{type(self).__name__} needs a transform that makes every image the same size "
                             f"({_sizes_said(self.image_sizes)}): pass transform=fastpipe.transforms."
                             f"RandomResizedCrop(224) or CenterCrop(224, resize=256) to the dataset, or "
                             f"transforms={{0: ...}} to the Loader")
        budgets = {}
        if device_decode:
            # Per record in the host slot and on the device: twice the mean, so that most records fit
            # (those that do not are decoded on the host).
            pixels = self.image_sizes[:, 0].astype(np.int64) * self.image_sizes[:, 1]
            budgets = dict(device_decode=True,
                           encoded_budget=int(min(self.max_record_bytes, max(256 << 10, 2 * self._mean_bytes()))),
                           pixel_budget=int(max(512 * 512, 2 * pixels.mean())))
        image = _C.ImageColumnSpec(self._source, transform._image_params(seed), self.max_record_bytes,
                                   fallback=_pillow.decode_rgb, **budgets)
        n = len(self)
        columns = [_C.ColumnSpec(path=self._where, data_offset=0, record_stride=0, record_bytes=0, num_records=n,
                                 image=image),
                   _labels_column(self._labels_path, n)]
        return columns, [transform._output(), ("int64", [])]

    _reader_pack = "tuple"  # (images, labels)

    def _pack(self, tensors):
        return tensors[0], tensors[1]

    def _items(self, batch):
        images, labels = batch
        return list(zip(images.unbind(0), labels.tolist()))  # labels as ints, as torchvision's ImageFolder's

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
        spec = _C.ImageColumnSpec(self._source, transform._image_params(0), self.max_record_bytes,
                                  fallback=_pillow.decode_rgb)
        label = int(np.load(self._labels_path, mmap_mode="r")[i])
        if self.target_transform is not None:
            label = self.target_transform(label)
        return _C.read_image_record(spec, i, 0), label

    def _bad_reason(self, i):
        return "its header could not be read"

    def _mean_bytes(self):
        raise NotImplementedError


class ImageFolder(_Images):
    """Image files read in place: a folder ``root/<class>/<...>/<file>.jpg``, or a list of samples.

    The classes, sample order and labels are torchvision's ``ImageFolder``'s (class folders sorted by
    name, files sorted within them, torchvision's image extensions), so indices and labels agree with it.
    A torchvision ``ImageFolder`` (or ``DatasetFolder``) given to :class:`fastpipe.Loader` is read through
    this class with its own ``samples`` and ``classes``.

    Parameters
    ----------
    root : path, optional
        The folder. With ``samples``, the folder they are under (default: their common folder).
    transform : RandomResizedCrop, CenterCrop or RandomCrop, optional
        How images become batch-sized (the Loader's ``transforms={0: ...}`` overrides it).
    target_transform : callable, optional
        Maps each label (an int), as torchvision's: the Loader calls it per sample and collates the results
        as DataLoader does.
    samples : list of (path, class_index), optional
        The files and their labels, as torchvision's ``samples``: relative paths are relative to the
        working directory (made absolute now). Default: the folder listed as torchvision lists it.
    classes : list of str, optional
        The class names of ``samples``' labels (default: their numbers).
    cache_dir : path, optional
        Where the index (file list, each image's format and size from its header, labels) is kept, so that
        a restart reads no header again. Default: ``$FASTPIPE_IMAGE_CACHE`` or
        ``$XDG_CACHE_HOME/fastpipe/image_folders`` (``~/.cache/fastpipe/image_folders``); ``"off"``: an
        index for this process only. The index is reused while no folder holding the files changed (their
        modification times); when one did, only the files whose size or modification time changed are read
        again. ``rescan=True`` reads every header again.
    rescan : bool
    num_threads : int, optional
        Threads reading headers during a scan (default: the cores, at least 32: they mostly wait on the disk,
        and a disk serves many reads at once; 4 took twice as long over ImageNet's 1.28 M files here).
    max_record_bytes : int
        An image file larger than this is an error naming it (64 MiB).

    Notes
    -----
    Formats are told by content, not by file name (ImageNet holds a PNG named .JPEG). JPEG, PNG and WebP
    are decoded in the reader threads, converted to RGB as Pillow's ``convert("RGB")`` does (what
    torchvision trains on); other formats (BMP, GIF, TIFF, PNM, animated WebP) by Pillow itself, holding
    the GIL for that image (counted in the Loader's ``stats()["images_pillow"]``). Files that cannot be
    decoded (a 12-bit or lossless JPEG, a truncated file, not an image) stay in the sample list, so
    indices match torchvision's, and are listed in ``bad`` with the reason, with a warning: the Loader
    raises on them (``on_error="raise"``) or substitutes other samples (``on_error="replace"``). EXIF
    orientation is not applied (as torchvision's ImageFolder, which opens images with PIL, does not).
    """

    def __init__(self, root=None, transform=None, *, target_transform=None, samples=None, classes=None, cache_dir=None,
                 rescan=False, num_threads=None, max_record_bytes=DEFAULT_MAX_RECORD_BYTES):
        self._init_common(transform, max_record_bytes, target_transform)
        rescan = checks.flag(rescan, "rescan")
        threads = max(32, os.cpu_count() or 1) if num_threads is None else checks.integer(num_threads, "num_threads",
                                                                                          low=1)
        cache = None if cache_dir is None else checks.path(cache_dir, "cache_dir")
        if samples is None:
            if root is None:
                raise TypeError("ImageFolder needs root (a folder of class folders) or samples")
            self.root = os.path.abspath(checks.path(root, "root"))
            if not os.path.isdir(self.root):
                raise FileNotFoundError(f"ImageFolder: '{self.root}' is not a directory")
            listing = {}
        else:
            self.root, listing = _sample_list(samples, classes, root)
        index, self.rescanned = image_index.load_or_scan(self.root, cache=cache, rescan=rescan, threads=threads,
                                                         **listing)
        # The labels the readers read, in a file of this dataset's own: a cached index may be replaced
        # under it (the tree changed, and another dataset of it scanned again).
        self._scratch = _scratch.ScratchArrays()
        self._labels_path = self._scratch.add(index["labels"], "the labels")
        self.classes = index["classes"]
        self._names, self._name_offsets = index["names"], index["name_offsets"]
        self.image_sizes = np.stack([index["heights"], index["widths"]], axis=1)
        self.image_formats = [_C.IMAGE_FORMATS[f] for f in index["formats"]]
        self._len = len(self._name_offsets) - 1
        self._where = self.root
        self.bad = [(i, self._path(i), why) for i, why in index["bad"]]
        self._file_bytes = index["bytes"]
        self._source = _C.ImageSource.folder(self.root, self._names, self._name_offsets, index["heights"],
                                             index["widths"])
        if self.bad:
            i, path, why = self.bad[0]
            warnings.warn(f"ImageFolder('{self.root}'): {len(self.bad)} of {self._len} files cannot be decoded "
                          f"(e.g. '{path}': {why}); see .bad. The Loader raises on them (on_error='raise') or "
                          f"replaces them with other samples (on_error='replace').", stacklevel=2)

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


def _sample_list(samples, classes, root):
    """(root, the index's listing keywords) of a sample list: names relative to root, labels, classes.
    Vectorised where it can be: ImageNet's list holds 1.28 M samples."""
    if not isinstance(samples, (list, tuple)) or not samples:
        raise ValueError("samples must be a non-empty list of (path, class_index)")
    try:
        paths, labels = zip(*samples)
    except (TypeError, ValueError):
        raise TypeError("samples must be a list of (path, class_index) pairs") from None
    labels = np.asarray(labels)
    if labels.dtype.kind not in "iu" or labels.min() < 0:
        raise ValueError(f"samples' class indices must be non-negative ints, got {labels.dtype} from {labels.min()}")
    paths = [os.path.abspath(os.fspath(p)) for p in paths]
    root = None if root is None else os.path.abspath(checks.path(root, "root"))
    if root is None or not all(p.startswith(root + os.sep) for p in paths):
        # No root, or samples outside it (a hand-made list): their common folder holds them.
        common = os.path.commonpath(paths)
        root = common if len(paths) > 1 and common not in paths else os.path.dirname(common)
    if classes is None:
        classes = [str(c) for c in range(int(labels.max()) + 1)]
    elif int(labels.max()) >= len(classes):
        raise ValueError(f"samples has class index {int(labels.max())} but classes names {len(classes)} classes")
    cut = len(root) + (0 if root.endswith(os.sep) else 1)
    names = [os.fsencode(p[cut:]) for p in paths]
    return root, {"names": names, "labels": labels, "classes": [str(c) for c in classes]}


class ImageDataset(_Images):
    """JPEG records packed by :func:`fastpipe.write_images`: one file of the original JPEG bytes, their
    offsets, sizes and labels, and the class list.

    Parameters
    ----------
    path : path or URL
        The folder write_images wrote, on local disk or uploaded as it is (``s3://bucket/imagenet-train``).
    transform, target_transform : optional
        As ImageFolder's.
    max_record_bytes : int
        As ImageFolder's.
    storage_options, cache_dir, cache_limit : optional
        A folder at an ``s3://`` or ``http(s)://`` URL: fetched into the local cache first, as
        :class:`WebDataset`'s shards are (the same settings; ``fetch_stats`` holds the counters).
    """

    def __init__(self, path, transform=None, *, target_transform=None, max_record_bytes=DEFAULT_MAX_RECORD_BYTES,
                 storage_options=None, cache_dir=None, cache_limit=None):
        path = checks.path(path, "path")
        self.fetch_stats = None
        if remote.is_remote(path):
            self.url = path
            path, self.fetch_stats = remote.local_folder(path, _PACKED_FILES + ("meta.json",), storage_options, cache_dir, cache_limit)
        elif storage_options is not None or cache_dir is not None or cache_limit is not None:
            raise ValueError("ImageDataset: storage_options, cache_dir and cache_limit apply to remote URLs "
                             "(s3://, http(s)://); this is a local path")
        self.path = os.path.abspath(path)
        self._init_common(transform, max_record_bytes, target_transform)
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
        return (f"ImageDataset('{getattr(self, 'url', self.path)}': {self._len} images, {len(self.classes)} classes, "
                f"transform={self.transform!r})")
