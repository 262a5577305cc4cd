"""DataLoader's ``batch_sampler`` in the Loader's terms. The reader's arena holds batches of one size, set at
construction, so a batch sampler is read as a sampler of its batches' indices in turn, each batch checked
to be of that size (the last may be smaller); torch's own BatchSampler is its sampler, size and drop_last."""

import torch

from fastpipe import _checks as checks


def from_batch_sampler(batch_sampler, *, batch_size, shuffle, sampler, drop_last):
    """(sampler, batch_size, drop_last) that read the batches ``batch_sampler`` lists (as given where it is
    None)."""
    if batch_sampler is None:
        if batch_size is None:
            raise TypeError("batch_size=None (DataLoader's items one by one, unbatched) is not supported: fastpipe "
                            "reads batches; use batch_size=1 and take each tensor's [0]")
        return sampler, batch_size, drop_last
    if batch_size != 1 or shuffle or sampler is not None or drop_last:
        raise ValueError("batch_sampler is mutually exclusive with batch_size, shuffle, sampler and drop_last (as in "
                         "DataLoader): the batch sampler sets them")
    if type(batch_sampler) is torch.utils.data.BatchSampler:  # a subclass may batch otherwise
        return batch_sampler.sampler, batch_sampler.batch_size, batch_sampler.drop_last
    if not hasattr(batch_sampler, "__iter__") or not hasattr(batch_sampler, "__len__"):
        raise TypeError(f"batch_sampler must be an iterable of batches of indices with a len(), got "
                        f"{type(batch_sampler).__name__}")
    size = getattr(batch_sampler, "batch_size", None)
    if size is None:
        raise TypeError(f"batch_sampler {type(batch_sampler).__name__} has no batch_size attribute: fastpipe's "
                        f"arena holds batches of one size, set before the first batch (give the batch sampler a "
                        f"batch_size, or use batch_size= with sampler=)")
    size = checks.integer(size, "batch_sampler.batch_size", low=1)
    return Batches(batch_sampler, size), size, False


class Batches:
    """A batch sampler's batches as one sampler's indices. Every batch has ``batch_size`` indices but the
    last, which may have fewer; the epoch (``set_epoch``, ``epoch``) is the batch sampler's, or its own
    sampler's where it has none (a BatchSampler subclass over a DistributedSampler)."""

    def __init__(self, batch_sampler, batch_size):
        self.batch_sampler = batch_sampler
        self.batch_size = batch_size

    def _with_epoch(self):
        if hasattr(self.batch_sampler, "set_epoch") or hasattr(self.batch_sampler, "epoch"):
            return self.batch_sampler
        return getattr(self.batch_sampler, "sampler", None)

    @property
    def epoch(self):
        return getattr(self._with_epoch(), "epoch", None)

    def set_epoch(self, epoch):
        set_epoch = getattr(self._with_epoch(), "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    def __iter__(self):
        short = None  # (batch number, size) of a batch smaller than batch_size: only the last may be
        for k, batch in enumerate(self.batch_sampler):
            indices = batch.tolist() if hasattr(batch, "tolist") else list(batch)
            if short is not None:
                self._refuse(f"batch {short[0]} has {short[1]} indices and batch {k} follows it")
            if not 0 < len(indices) <= self.batch_size:
                self._refuse(f"batch {k} has {len(indices)} indices")
            if len(indices) < self.batch_size:
                short = (k, len(indices))
            yield from indices

    def _refuse(self, what):
        raise ValueError(f"batch_sampler's {what}: fastpipe reads batches of batch_size={self.batch_size} "
                         f"indices (the batch sampler's), only the last batch may have fewer")

    def __len__(self):
        return len(self.batch_sampler) * self.batch_size
