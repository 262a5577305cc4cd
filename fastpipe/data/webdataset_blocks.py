"""A WebDataset's blocks: its shards cut into runs of whole samples (``block_size``), the unit that
shuffle="blocks" permutes and, for a remote dataset larger than its cache, the unit fetched and cached."""

import numpy as np


class Blocks:
    """The blocks of samples listed in shard order, then archive order: the samples whose images start in
    one ``block_size``-aligned stretch of their shard (``whole_shards``: a block per shard)."""

    def __init__(self, shard_of, offsets, sizes, block_size, whole_shards=False):
        cut = np.diff(shard_of, prepend=-1) != 0
        if not whole_shards:
            cut |= np.diff(offsets // block_size, prepend=-1) != 0
        self.starts = np.flatnonzero(cut).astype(np.int64)  # each block's first sample
        self.of = np.cumsum(cut) - 1                         # each sample's block
        self.shard = shard_of[self.starts]
        # Each block's bytes in its shard: its images' span (tar headers and other members outside it).
        self.begin = offsets[self.starts]
        self.end = np.maximum.reduceat(offsets + sizes, self.starts)
        self.bytes = self.end - self.begin

    def __len__(self):
        return len(self.starts)


def first_use(units):
    """The distinct values of ``units`` in the order they first appear (a pass's shards or blocks)."""
    found, first = np.unique(units, return_index=True)
    return found[np.argsort(first)].astype(np.int32)
