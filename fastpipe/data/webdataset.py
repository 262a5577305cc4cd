"""WebDataset shards: tar archives of samples, each sample the members that share a key
(``n01440764_10026.jpg`` and ``n01440764_10026.cls``), read by the same C++ image path as ImageFolder.
"""

import os
import re
import warnings

import numpy as np

from fastpipe import _checks as checks
from fastpipe._ext import _C
from fastpipe.data import _scratch, image_index, remote, webdataset_index
from fastpipe.data.images import DEFAULT_MAX_RECORD_BYTES, _Images
from fastpipe.data.webdataset_blocks import Blocks, first_use

_NUMBERS = re.compile(r"(-?\d+)\.\.(-?\d+)(?:\.\.(-?\d+))?")
_LETTERS = re.compile(r"([a-zA-Z])\.\.([a-zA-Z])(?:\.\.(-?\d+))?")


def expand_urls(urls):
    """The shard list ``urls`` names: a string with brace ranges and alternatives, expanded as webdataset's
    (braceexpand's) ``train-{000000..000127}.tar``, ``{train,extra}-{0..3}.tar``, ``{0..9..3}``, ``{a..c}``
    (zero-padded when a bound is), or a list of such strings."""
    if isinstance(urls, (str, os.PathLike)):
        urls = [os.fspath(urls)]
    elif not isinstance(urls, (list, tuple)) or not urls:
        raise TypeError(f"urls must be a path or URL (with brace ranges) or a non-empty list of them, got "
                        f"{type(urls).__name__}")
    out = []
    for u in urls:
        if not isinstance(u, (str, os.PathLike)):
            raise TypeError(f"urls must hold paths or URLs, got {type(u).__name__}")
        out += _expand(os.fspath(u), os.fspath(u))
    return out


def _expand(text, whole):
    start = text.find("{")
    if start < 0:
        if "}" in text:
            raise ValueError(f"urls: unbalanced brace in '{whole}'")
        return [text]
    depth, cuts = 0, []  # the group's end, and its top-level commas
    for end in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 1 and text[end] == ",":
            cuts.append(end)
        if depth == 0:
            break
    else:
        raise ValueError(f"urls: unbalanced brace in '{whole}'")
    body, head, tail = text[start + 1:end], text[:start], text[end + 1:]
    if cuts:
        bounds = [start] + cuts + [end]
        items = [text[a + 1:b] for a, b in zip(bounds, bounds[1:])]
    else:
        items = _range(body, whole)
    return [x for item in items for x in _expand(head + item + tail, whole)]


def _range(body, whole):
    m = _NUMBERS.fullmatch(body) or _LETTERS.fullmatch(body)
    if m is None:
        raise ValueError(f"urls: '{{{body}}}' in '{whole}' is neither a range {{a..b}} nor alternatives {{a,b}}")
    a, b, step = m.group(1), m.group(2), abs(int(m.group(3) or 1)) or 1
    if m.re is _LETTERS:
        lo, hi = ord(a), ord(b)
        return [chr(v) for v in range(lo, hi + 1, step)] if lo <= hi else [chr(v) for v in range(lo, hi - 1, -step)]
    lo, hi = int(a), int(b)
    padded = any(len(x.lstrip("-")) > 1 and x.lstrip("-").startswith("0") for x in (a, b))
    width = max(len(a), len(b)) if padded else 0
    values = range(lo, hi + 1, step) if lo <= hi else range(lo, hi - 1, -step)
    return [str(v).zfill(width) for v in values]


class WebDataset(_Images):
    """Images and labels from WebDataset tar shards: on local disk, in S3 or on an HTTP(S) server.

    Samples are the shards' members grouped by key as the webdataset package groups them (the key runs
    to the first dot of a member's file name; a sample is the run of consecutive members sharing it),
    in shard order then archive order. Each sample's image is its first member with an image extension
    (torchvision's: jpg, jpeg, png, ppm, bmp, pgm, tif, tiff, webp; the format is told by content), its
    label the decimal integer of its ``.cls`` member (``label=`` names another extension, ``label_field=`` a
    field of a JSON member). Everything
    an ImageFolder has applies: the fused transforms, ``image_decode="device"``, ``on_error``,
    samples that cannot be decoded listed in ``bad``.

    Parameters
    ----------
    urls : path or URL, or list of them
        The shards, with brace ranges: ``"/data/imagenet/train-{000000..001023}.tar"``,
        ``"s3://bucket/imagenet/train-{000000..001023}.tar"``, ``"https://host/train-{0..9}.tar"``. Remote
        shards are fetched into ``cache_dir`` while the Loader reads (those already there in the same
        version, by ETag and size, are not fetched again) and read from there.
    transform, target_transform : optional
        As ImageFolder's.
    label : str
        The extension of the member holding each sample's label (default ``"cls"``: a decimal integer).
    label_field : str, optional
        The label is this top-level field of the JSON object the ``label`` member holds:
        ``WebDataset(urls, label="json", label_field="class_id")`` (parsed as ``json.loads`` parses it; the
        field must hold a non-negative integer).
    num_threads : int, optional
        Threads indexing the shards at construction (one shard each at a time; default: the cores, at least 8).
    max_record_bytes : int
        An image member larger than this is an error naming it (64 MiB).
    storage_options : dict, optional
        For remote URLs, fsspec's (s3fs's) names: ``endpoint_url``, ``region``, ``anon`` (unsigned
        requests), ``key``/``secret``/``token``, ``profile``, ``addressing_style`` (``"auto"``: virtual-hosted
        on AWS's endpoints, path style on others; ``"path"``, ``"virtual"``), ``client_kwargs``
        (``region_name``, ``endpoint_url``); and the transport's ``max_in_flight`` (requests at once, 16),
        ``part_size`` (one ranged GET, 8 MiB), ``max_attempts`` (8), ``retry_backoff`` (the first retry's
        delay in seconds, doubled each time, with jitter: 0.2), ``connect_timeout`` (10 s), ``stall_timeout``
        (a transfer receiving nothing this long is retried: 30 s). S3 credentials are looked up as botocore
        does: these options, then AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN, then the profile
        (AWS_PROFILE, else ``default``) in ~/.aws/credentials and ~/.aws/config (AWS_SHARED_CREDENTIALS_FILE,
        AWS_CONFIG_FILE); the endpoint from AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL or the profile's
        ``endpoint_url``; the region from AWS_REGION, AWS_DEFAULT_REGION or the profile. Instance metadata,
        SSO and web identity are not read.
    cache_dir : path, optional
        Where remote shards are kept (default ``$FASTPIPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/fastpipe/shards``,
        i.e. ``~/.cache/fastpipe/shards``; made with its parents).
        Processes sharing it (the ranks of a node) fetch each shard once.
    index_cache : path, URL or "off", optional
        Where the shards' index is kept (default: next to ImageFolder's,
        ``$XDG_CACHE_HOME/fastpipe/webdatasets``, i.e. ``~/.cache/fastpipe/webdatasets``), so that a new
        WebDataset over the same shards (a local one's path, size and modification time; a remote one's
        URL, ETag and size) reads no tar header again: a remote dataset then starts reading as soon as its
        first shard has arrived, with no shard fetched at construction. The index's folder is named by the
        shards and these settings, not by the machine: on several nodes, an index_cache they share (or the
        folder copied from the node that built it) spares the others fetching every shard once to index it.
        For remote shards it may also be the URL of a folder of published indexes (``s3://bucket/indexes``,
        read with the same storage_options): the index is read from ``<URL>/<its folder name>/``; where
        there is none, it is built, kept locally and uploaded there (two PUTs), so that later jobs on fresh
        machines start without fetching every shard. Where the upload fails (credentials that may only
        read, an HTTP server that takes no PUT), a warning says why and names the two files to upload.
    cache_limit : int or str, optional
        The most bytes the cache may hold (``"200GB"``), at least the largest shard. Shards stream through
        it: fetched ahead in the order each pass reads them, as far as the limit allows; other datasets'
        files evicted first (least recently staged first), then this dataset's shards the pass reads no
        more, then those it reads latest. A dataset larger than the limit streams in blocks (see
        ``block_size``; whole shards from a server that does not take ranges), needs ``shuffle="blocks"``
        (or no shuffle) with a ``shuffle_window`` that fits in it (a block to spare lets the next one
        arrive while the window is read), and is fetched again each epoch; one that fits is fetched once
        and read from the cache from then on. Default: no limit but the disk's free space.
    block_size : int or str
        Shards are cut into blocks of whole samples, those whose images start in one ``block_size``-aligned
        stretch of the shard (``"16MiB"``; a shard smaller than that is one block): the unit that
        ``shuffle="blocks"`` permutes and mixes a window of, and, for a remote dataset larger than
        ``cache_limit``, the unit fetched (a ranged GET of the images' bytes, tar headers and other members
        left out) and cached. Smaller blocks mix more shards in a window of the same bytes (with shards
        written class by class, more classes in a batch) for more requests.

    Notes
    -----
    Remote shards: each is fetched with ranged GETs in flight together (connections reused, no GIL),
    each request retried with exponential backoff and jitter on 5xx, 429, timeouts, stalls and resets and
    resumed at the byte it stopped at; 403, 404 and missing credentials are errors at construction naming
    the URL (FileNotFoundError for a 404, PermissionError for a 401 or 403). A shard is written under a
    temporary name and renamed when complete; a shard that changes on the server while it is fetched is an
    error (If-Match), and a later version is a new cache file, never mixed with the old bytes. A shard that
    cannot be fetched while the Loader reads is an error of the batches holding its samples, naming the URL
    (``on_error="replace"`` replaces them). ``fetch_stats`` holds the counters so far.

    Construction reads every shard's tar headers, its labels and its images' headers (no image data; once:
    the index is kept, see ``index_cache``; remote shards are fetched for it a ``cache_limit`` at a time); a
    malformed or truncated archive, a sample holding two members of one extension (webdataset refuses
    those too) or a sample without a label is an error naming the shard. Samples without an image member
    are skipped and counted in ``without_image`` (per shard), with a warning.
    """

    def __init__(self, urls, transform=None, *, target_transform=None, label="cls", label_field=None, num_threads=None,
                 max_record_bytes=DEFAULT_MAX_RECORD_BYTES, storage_options=None, cache_dir=None, cache_limit=None,
                 index_cache=None, block_size="16MiB"):
        self._init_common(transform, max_record_bytes, target_transform)
        if not isinstance(label, str) or not label or label.startswith("."):
            raise ValueError(f"label must be a member extension such as 'cls', got {label!r}")
        if label_field is not None and (not isinstance(label_field, str) or not label_field):
            raise ValueError(f"label_field must be the name of a JSON field, got {label_field!r}")
        threads = max(8, os.cpu_count() or 1) if num_threads is None else checks.integer(num_threads, "num_threads",
                                                                                         low=1)
        block_size = checks.byte_size(block_size, "block_size")
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1 byte, got {block_size}")
        shards = expand_urls(urls)
        self._stream = None
        if remote.all_remote(shards, storage_options, cache_dir, cache_limit, "WebDataset"):
            self._stream = remote.stream(shards, storage_options, cache_dir, cache_limit)
            self._paths, self.urls = self._stream.paths, shards
        else:
            self._paths = self.urls = [os.path.abspath(s) for s in shards]
            missing = [s for s in self._paths if not os.path.isfile(s)]
            if missing:
                raise FileNotFoundError(f"WebDataset: {len(missing)} of {len(self.urls)} shards do not exist, e.g. "
                                        f"'{missing[0]}'")
        extensions = [e.lstrip(".") for e in image_index.IMG_EXTENSIONS]
        try:
            index = webdataset_index.indexed(
                self._paths, extensions, label.lower(), label_field or "", threads, index_cache, self._stream,
                self.urls, lambda urls: remote.stage(urls, storage_options, cache_dir, cache_limit),
                lambda url, data: remote.put(url, data, storage_options))
        except (ValueError, OSError) as e:
            if self._paths is self.urls:
                raise
            message = str(e)  # name the URL, not its cache file
            for path, url in zip(self._paths, self.urls):
                message = message.replace(f"'{path}'", f"'{url}' (cached as '{path}')")
            raise type(e)(message) from None
        n = len(index["labels"])
        if n == 0:
            raise ValueError(f"WebDataset: the {len(self.urls)} shards hold no sample with an image member "
                             f"(extensions {', '.join(extensions)})")
        self.label, self.label_field = label, label_field
        self._len = n
        self._keys, self._key_offsets = index["keys"], index["key_offsets"]
        self._shard_of = index["shard_of"]
        self._shard_sizes = self._stream.sizes if self._stream else [os.path.getsize(p) for p in self._paths]
        self._sizes = index["sizes"]
        self.image_sizes = np.stack([index["heights"], index["widths"]], axis=1)
        self.image_formats = [_C.IMAGE_FORMATS[f] for f in index["formats"]]
        labels = index["labels"]
        self.classes = [str(c) for c in range(int(labels.max()) + 1)]
        self._scratch = _scratch.ScratchArrays()
        self._labels_path = self._scratch.add(labels, "the labels")
        self._where = self.urls[0] if len(self.urls) == 1 else os.path.commonprefix(self.urls).rpartition("/")[0]
        self.block_size = block_size
        names, unit_of, offsets = self._split_into_blocks(index["offsets"])
        # A remote shard's messages name its URL; the stream opens its cache file.
        self._source = _C.ImageSource.members(names, unit_of, offsets, self._sizes, self._keys, self._key_offsets,
                                              index["heights"], index["widths"], self._stream)
        self.without_image = dict((u, int(c)) for u, c in zip(self.urls, index["without_image"]) if c)
        if self.without_image:
            total = sum(self.without_image.values())
            shard, count = next(iter(self.without_image.items()))
            warnings.warn(f"WebDataset: {total} samples hold no image member and are skipped (e.g. {count} in "
                          f"'{shard}'); see .without_image", stacklevel=2)
        self.bad = [(i, self.key(i), why) for i, why in zip(index["bad"], index["reasons"])]
        if self.bad:
            i, key, why = self.bad[0]
            warnings.warn(f"WebDataset: {len(self.bad)} of {n} images cannot be decoded (e.g. sample '{key}' of "
                          f"'{self.urls[self._shard_of[i]]}': {why}); see .bad. The Loader raises on them "
                          f"(on_error='raise') or replaces them with other samples (on_error='replace').",
                          stacklevel=2)

    @property
    def fetch_stats(self):
        """Remote shards: the transfer's counters so far (cache_hits, shards_fetched, shards_waited,
        shards_evicted, shards_fetching (on their way now, the next epoch's first ones included),
        bytes_fetched, requests, retries, network_seconds, blocked_seconds; a dataset streaming in blocks
        counts blocks as shards after the index's whole shards); None for local shards."""
        if self._stream is None:
            return None
        return {k: v + self._fetched_whole.get(k, 0) for k, v in self._stream.stats().items()}

    def _split_into_blocks(self, offsets):
        """Cuts the shards into blocks (webdataset_blocks.py); where a remote dataset is larger than its
        cache, the stream then fetches and caches blocks (a window of blocks mixes many shards in the bytes
        of a few). Returns what the image source reads by: (names, the unit of each sample, the offsets in
        the units)."""
        offsets = np.asarray(offsets, dtype=np.int64)
        limit = self._stream.limit if self._stream is not None else -1
        too_large = 0 <= limit < sum(self._shard_sizes)
        # Without ranges a block would cost its whole shard's transfer.
        self._shard_blocks = Blocks(self._shard_of, offsets, self._sizes, self.block_size,
                                    whole_shards=too_large and not all(self._stream.ranges))
        blocks = self._shard_blocks
        self._fetched_whole = {}  # the counters of the shards' stream, when blocks replace it
        if too_large and len(blocks) > len(self.urls):
            self._fetched_whole = self._stream.stats()
            self._stream = self._stream.blocks(blocks.shard.astype(np.int32).tolist(), blocks.begin.tolist(),
                                               blocks.end.tolist())
            self._unit_of, self._unit_bytes = blocks.of, blocks.bytes
            return [self.urls[k] for k in blocks.shard], blocks.of, offsets - blocks.begin[blocks.of]
        self._unit_of, self._unit_bytes = self._shard_of, np.asarray(self._shard_sizes, dtype=np.int64)
        return self.urls, self._shard_of, offsets

    def _plan(self, indices, following=None, ahead=1):
        """A pass reads ``indices``: the stream fetches their shards (blocks) ahead in that order, and then,
        with room left, the next pass's first ``ahead`` (its first window: what it starts by reading;
        ``following()``: its indices; None: unknown). No more: after a run's last epoch they are wasted."""
        if self._stream is None:
            return
        units = self._unit_of[indices]
        reads = np.bincount(units, minlength=len(self._unit_bytes))
        after = first_use(self._unit_of[following()])[:ahead] if following is not None else np.zeros(0, np.int32)
        need = {}
        if self._unit_of is self._shard_of:
            # Whole shards: their blocks' bytes in the order the pass first reads them, so that a window
            # of blocks from many shards is fetched before the rest of those shards.
            b = self._shard_blocks
            first = first_use(b.of[indices])
            need = dict(need_shard=b.shard[first].astype(np.int32).tolist(), need_begin=b.begin[first].tolist(),
                        need_end=b.end[first].tolist())
        self._stream.plan(first_use(units), reads.astype(np.int64), after, **need)

    def _check_order(self, shuffle, shuffle_window, window_blocks):
        """A Loader's order must fit the cache: a shard per sample (shuffle=True) or a window of blocks
        larger than cache_limit would fetch every shard many times over."""
        limit = self._stream.limit if self._stream is not None else -1
        if limit < 0 or sum(self._shard_sizes) <= limit:
            return
        if shuffle is True:
            raise ValueError(f"WebDataset: its shards hold {sum(self._shard_sizes)} bytes, more than cache_limit="
                             f"{limit}, and shuffle=True draws each sample from any shard: nearly every sample "
                             f"would fetch a shard. Use shuffle='blocks' (blocks of shards in a new order each "
                             f"epoch, samples mixed within a shuffle_window of them), or raise cache_limit")
        if shuffle == "blocks":
            # The readers hold up to the window's blocks at once, and any blocks may come together: a
            # window the cache cannot hold would evict blocks still to be read (the next block arriving
            # while they are read needs room for one more, else it waits: slower, never refetched).
            need = int(np.sort(self._unit_bytes)[-window_blocks:].sum())
            if need > limit:
                raise ValueError(f"shuffle_window={shuffle_window!r} ({window_blocks} blocks) does not fit in "
                                 f"cache_limit={limit} bytes (its largest {window_blocks} blocks hold {need}): "
                                 f"the window's blocks are read together, so they must be in the cache together "
                                 f"(lower shuffle_window or raise cache_limit)")

    def key(self, i):
        """Sample ``i``'s key (webdataset's ``__key__``)."""
        i = self._index(i)
        return os.fsdecode(self._keys[self._key_offsets[i]:self._key_offsets[i + 1]])

    def _bad_reason(self, i):
        return dict((j, why) for j, _, why in self.bad).get(i, "its header could not be read")

    def _blocks(self):
        """(the first sample of each block, each block's shard, the blocks' mean bytes): shuffle='blocks'."""
        return self._shard_blocks.starts, self._shard_blocks.shard, float(np.mean(self._shard_blocks.bytes))

    def _mean_bytes(self):
        return float(self._sizes.mean())

    def __repr__(self):
        return (f"WebDataset({len(self.urls)} shards under '{self._where}': {self._len} images, "
                f"{len(self.classes)} classes, transform={self.transform!r})")
