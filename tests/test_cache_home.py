"""Every cache fastpipe keeps when not told where (fastpipe/_cache_home.py) is under $XDG_CACHE_HOME/fastpipe,
else ~/.cache/fastpipe, and each one's own variable still overrides it."""

import os

from fastpipe.data import image_index, remote, webdataset_index
from fastpipe.nn import _engines


def _defaults():
    return {"image folders": image_index.default_cache(), "shard indexes": webdataset_index.default_root(),
            "shards": remote.default_cache_dir(), "conv engines": _engines._default_cache_path()}


def test_the_caches_follow_xdg_cache_home_else_the_home_folder(tmp_path, monkeypatch):
    for name in ("FASTPIPE_IMAGE_CACHE", "FASTPIPE_CACHE_DIR", "FASTPIPE_CONV_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _defaults() == {"image folders": str(tmp_path / "xdg" / "fastpipe" / "image_folders"),
                           "shard indexes": str(tmp_path / "xdg" / "fastpipe" / "webdatasets"),
                           "shards": str(tmp_path / "xdg" / "fastpipe" / "shards"),
                           "conv engines": str(tmp_path / "xdg" / "fastpipe" / "conv_engines.json")}
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    home = os.path.join(str(tmp_path / "home"), ".cache", "fastpipe")
    assert set(_defaults().values()) == {os.path.join(home, f) for f in
                                         ("image_folders", "webdatasets", "shards", "conv_engines.json")}
    monkeypatch.setenv("FASTPIPE_IMAGE_CACHE", str(tmp_path / "images"))
    monkeypatch.setenv("FASTPIPE_CACHE_DIR", str(tmp_path / "shards"))
    monkeypatch.setenv("FASTPIPE_CONV_CACHE", str(tmp_path / "conv.json"))
    assert _defaults() == {"image folders": str(tmp_path / "images"), "shard indexes": str(tmp_path / "webdatasets"),
                           "shards": str(tmp_path / "shards"), "conv engines": str(tmp_path / "conv.json")}
