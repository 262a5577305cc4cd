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
from fastpipe.data import image_index

_FORMAT = "fastpipe.WebDataset/1"
_ARRAYS = ("shard_of", "offsets", "sizes", "labels", "key_offsets", "heights", "widths", "formats", "bad",
           "without_image")


def default_root():
    """``~/.cache/fastpipe/webdatasets``: next to ImageFolder's index cache."""
    return os.path.join(os.path.dirname(image_index.default_cache()), "webdatasets")


def indexed(paths, extensions, label, label_field, threads, index_cache, stream=None, urls=None):
    """The shards' index, from the index cache when it holds one of these very shards with these
    settings (a local shard: its path, size and modification time; a remote one: its URL, ETag and size,
    so that no shard need be in the shard cache); else read, and kept. ``stream``: the shards are remote,
    streamed through it (``paths`` are their cache files, ``urls`` their URLs)."""
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
    root = os.fspath(index_cache) if index_cache is not None else default_root()
    folder = os.path.join(root, hashlib.sha256(key.encode()).hexdigest()[:20])
    try:
        with open(os.path.join(folder, "index.json")) as f:
            meta = json.load(f)
        if meta["key"] == key:
            arrays = np.load(os.path.join(folder, "index.npz"))
            index = {k: arrays[k] for k in _ARRAYS}
            index["keys"] = arrays["keys"].tobytes()
            index["reasons"] = meta["reasons"]
            return index
    except (OSError, ValueError, KeyError):
        pass
    index = build()

    def write(tmp):
        np.savez(os.path.join(tmp, "index.npz"), keys=np.frombuffer(index["keys"], dtype=np.uint8),
                 **{k: index[k] for k in _ARRAYS})
        with open(os.path.join(tmp, "index.json"), "w") as f:  # last: its presence marks a whole index
            json.dump({"key": key, "reasons": index["reasons"]}, f)

    try:
        image_index.save_folder(folder, write)
    except OSError as e:
        warnings.warn(f"WebDataset: cannot keep its index under '{root}' ({e}); the shards' headers will be read "
                      f"again next time (set index_cache=)", stacklevel=4)
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
