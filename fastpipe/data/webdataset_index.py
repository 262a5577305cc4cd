"""The index of WebDataset shards (each sample's shard, image member, label, key and image header size),
read once from the tar headers and kept in the index cache; remote shards are indexed as they stream
through the bounded shard cache, a cache-full of them at a time."""

import hashlib
import json
import os
import sys
import warnings

import numpy as np

from fastpipe._ext import _C
from fastpipe.data import image_index, remote

_FORMAT = "fastpipe.WebDataset/1"
_ARRAYS = ("shard_of", "offsets", "sizes", "labels", "key_offsets", "heights", "widths", "formats", "bad",
           "without_image")


def default_root():
    """``~/.cache/fastpipe/webdatasets``: next to ImageFolder's index cache."""
    return os.path.join(os.path.dirname(image_index.default_cache()), "webdatasets")


def indexed(paths, extensions, label, label_field, threads, index_cache, stream=None, urls=None, fetch=None,
            put=None):
    """The shards' index, from the index cache when it holds one of these very shards with these
    settings (a local shard: its path, size and modification time; a remote one: its URL, ETag and size,
    so that no shard need be in the shard cache); else read, and kept. ``stream``: the shards are remote,
    streamed through it (``paths`` are their cache files, ``urls`` their URLs). ``index_cache`` may be
    the URL of a folder of published indexes (remote shards only), read with ``fetch(urls)`` (their
    local paths) and published with ``put(url, bytes)``."""
    def build():
        if stream is None:
            return _C.index_webdataset(paths, extensions, label, label_field, threads)
        return _streamed(stream, paths, extensions, label, label_field, threads)

    if index_cache == "off":
        return build()
    if stream is None:
        stats = [os.stat(p) for p in paths]
        shards = [[p, s.st_size, s.st_mtime_ns] for p, s in zip(paths, stats)]
    else:
        shards = [[u, e, s] for u, e, s in zip(urls, stream.etags, stream.sizes)]
    key = json.dumps([_FORMAT, shards, extensions, label, label_field])
    name = hashlib.sha256(key.encode()).hexdigest()[:20]
    published = index_cache is not None and remote.is_remote(os.fspath(index_cache))
    if published and stream is None:
        raise ValueError(f"index_cache: a URL ('{index_cache}') holds indexes of remote shards only (a local "
                         f"shard's index names its path and modification time on this machine)")
    # Where it is kept here: a published one's copy, when built, in the default local cache.
    folder = os.path.join(default_root() if index_cache is None or published else os.fspath(index_cache), name)
    if published:
        return _published(os.fspath(index_cache).rstrip("/") + f"/{name}/", folder, key, build, fetch, put)
    index = _read(os.path.join(folder, "index.json"), os.path.join(folder, "index.npz"), key)
    if index is None:
        index = build()
        _keep(folder, key, index, stacklevel=4)
    return index


def _read(meta_path, arrays_path, key):
    """The index in these files when they hold this key's, else None."""
    try:
        with open(meta_path) as f:
            meta = json.load(f)
        if meta["key"] != key:
            return None
        arrays = np.load(arrays_path)
        index = {k: arrays[k] for k in _ARRAYS}
        index["keys"] = arrays["keys"].tobytes()
        index["reasons"] = meta["reasons"]
        return index
    except (OSError, ValueError, KeyError):
        return None


def _keep(folder, key, index, stacklevel):
    """Writes the index into `folder`; warns where it cannot (`stacklevel`: the user's frame from here)."""
    def write(tmp):
        np.savez(os.path.join(tmp, "index.npz"), keys=np.frombuffer(index["keys"], dtype=np.uint8),
                 **{k: index[k] for k in _ARRAYS})
        with open(os.path.join(tmp, "index.json"), "w") as f:  # last: its presence marks a whole index
            json.dump({"key": key, "reasons": index["reasons"]}, f)

    try:
        image_index.save_folder(folder, write)
    except OSError as e:
        warnings.warn(f"WebDataset: cannot keep its index under '{os.path.dirname(folder)}' ({e}); the shards' "
                      f"headers will be read again next time (set index_cache=)", stacklevel=stacklevel)
        return False
    return True


def _published(where, folder, key, build, fetch, put):
    """The index published at the folder URL `where` (its index.json and index.npz, as _keep writes them);
    where there is none, built here, kept in the local `folder` and uploaded there: index.npz first, so
    that a reader finds a whole index or none. Where the upload fails (credentials that may only read, a
    server that takes no PUT), a warning says why and what to upload."""
    try:
        (meta_path, arrays_path), _ = fetch([where + "index.json", where + "index.npz"])
    except FileNotFoundError:
        index = build()
        if _keep(folder, key, index, stacklevel=5):
            try:
                for name in ("index.npz", "index.json"):  # the json last: its presence marks a whole index
                    with open(os.path.join(folder, name), "rb") as f:
                        put(where + name, f.read())
            except OSError as e:
                warnings.warn(f"WebDataset: no index at '{where}': built here and kept in '{folder}', but uploading "
                              f"it failed ({e}); upload its index.json and index.npz to '{where}', and machines "
                              f"reading it there start without fetching every shard", stacklevel=4)
        return index
    index = _read(meta_path, arrays_path, key)
    if index is None:
        raise ValueError(f"index_cache: the index at '{where}' is not these shards' or cannot be read; publish "
                         f"this dataset's there (as a local index_cache keeps it), or set index_cache=None")
    return index


_GROUP_SHARDS = 64  # shards fetched and indexed together (fewer when the cache limit says so)


def _progress(total):
    """A tqdm bar over the bytes to fetch, where tqdm is installed and stderr is a terminal; else None."""
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="B", unit_scale=True, desc="WebDataset: fetching shards for the index")


def _streamed(stream, paths, extensions, label, label_field, threads):
    """Indexes remote shards a cache-full at a time (and at most _GROUP_SHARDS): each group fetched and
    pinned, indexed, released."""
    sizes, limit = stream.sizes, stream.limit
    groups, group, held = [], [], 0
    for k, size in enumerate(sizes):
        if group and (len(group) == _GROUP_SHARDS or (limit >= 0 and held + size > limit)):
            groups.append(group)
            group, held = [], 0
        group.append(k)
        held += size
    groups.append(group)
    parts, bar = [], _progress(sum(sizes))
    try:
        for group in groups:
            stream.pin(group)
            try:
                parts.append(_C.index_webdataset([paths[k] for k in group], extensions, label, label_field, threads))
            finally:
                stream.unpin(group)
            if bar is not None:
                bar.update(sum(sizes[k] for k in group))
    finally:
        if bar is not None:
            bar.close()
    return _joined(parts, [g[0] for g in groups])


def _joined(parts, first_shards):
    """One index of the groups' indexes (each counts its shards and samples from 0)."""
    if len(parts) == 1:
        return parts[0]
    samples = np.cumsum([0] + [len(p["labels"]) for p in parts])
    keys = np.cumsum([0] + [len(p["keys"]) for p in parts])
    out = {k: np.concatenate([p[k] for p in parts]) for k in ("offsets", "sizes", "labels", "heights", "widths",
                                                            "formats", "without_image")}
    out["shard_of"] = np.concatenate([p["shard_of"] + s for p, s in zip(parts, first_shards)]).astype(np.int32)
    out["key_offsets"] = np.concatenate([parts[0]["key_offsets"][:1]] +
                                        [p["key_offsets"][1:] + k for p, k in zip(parts, keys)])
    out["bad"] = np.concatenate([p["bad"] + n for p, n in zip(parts, samples)]).astype(parts[0]["bad"].dtype)
    out["keys"] = b"".join(p["keys"] for p in parts)
    out["reasons"] = [r for p in parts for r in p["reasons"]]
    return out
