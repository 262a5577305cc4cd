"""Where fastpipe keeps what it learns between runs, when not told: ``$XDG_CACHE_HOME/fastpipe``, else
``~/.cache/fastpipe`` (image folders' and shards' indexes, remote shards, the conv engine choices)."""

import os


def cache_home(*parts):
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fastpipe", *parts)
