"""A pass over a Loader (the iterator ``iter(loader)`` returns) and the Loader's own order standing in for a
sampler."""

import weakref

from fastpipe._ext import _C
from fastpipe.data import _collate


class OwnOrder:
    """A Loader's own order (shuffle, seed, shard) standing in for a sampler: its epoch is the Loader's."""

    def __init__(self, loader):
        self._loader = weakref.ref(loader)

    @property
    def epoch(self):
        return self._loader().epoch

    def set_epoch(self, epoch):
        self._loader().set_epoch(epoch)

    def __iter__(self):
        loader = self._loader()
        return iter(loader._positions(loader.epoch).tolist())

    def __len__(self):
        return self._loader()._num_samples()


def epoch_of(sampler):
    """A sampler's epoch (DistributedSampler's and the like's ``epoch``), or None."""
    epoch = getattr(sampler, "epoch", None)
    return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) and epoch >= 0 else None


class EpochIterator(_C.PassIterator):
    """One pass over the loader; a new iter(), set_epoch() or load_state_dict() supersedes it once it has
    yielded a batch (before that, it starts again from the new position: Loader._reclaim).

    ``__next__`` is the C base's (csrc/ops/pass_iterator.cpp): while the pass is under way (``_hot``) it
    calls the reader's ``next(_timeout)`` and ``_pack`` without a Python frame; otherwise it calls
    ``_next_checked()``. Either way None ends the pass (``_done``) and a batch advances ``position``."""

    __slots__ = ("_loader", "epoch", "offset", "_start_position", "_superseded_by", "_stale", "_resumed", "_ref",
                 "__weakref__")

    def __init__(self, loader):
        self._ref = weakref.ref(self)  # what the Loader holds of its pass (Loader._active)
        self._loader = loader
        self._next = loader._reader.next_function()  # the reader's next(), bound without pybind11's dispatch
        self._pack = _collate.packer(loader._source, loader.collate_fn)
        self.epoch = None
        self.position = self._start_position = 0
        self.offset = 0  # samples of the epoch's order read before this pass (a resume with another world size)
        self._superseded_by = None
        self._stale = False  # reclaimed by the Loader: starts again at the first next()
        self._resumed = None  # the resume position the pass took

    def _next_checked(self):
        """The reader's next batch after the checks of a pass's first batch and of a finished or
        superseded pass; a batch read makes the pass hot (``__next__`` skips them until a change to the
        Loader clears ``_hot``: a new position, or its timeout)."""
        if self._done:
            raise StopIteration
        if self._superseded_by is not None:
            raise RuntimeError(f"this iterator was superseded by {self._superseded_by}: iterate the Loader anew")
        if self.position == self._start_position:
            moved = epoch_of(self._loader._sampler)
            if self._stale or (moved is not None and moved != self.epoch):
                self._loader._reclaim()
                self._loader._start(self)
        self._timeout = self._loader._timeout
        batch = self._next(self._timeout)
        self._hot = batch is not None
        return batch

    def __del__(self):
        # The Loader holds its pass weakly (a strong reference both ways would leave a dropped Loader, its
        # reader threads and arena, to the garbage collector); what it needs of a pass it keeps.
        loader = getattr(self, "_loader", None)
        if loader is not None and loader._pass is self._ref:
            loader._pass = EndedPass(self)

    def __len__(self):
        if self._stale:
            state = self._loader.state_dict()
            return self._loader._pass_batches(state["offset"]) - state["batch"]
        return self._loader._pass_batches(self.offset) - self.position


class EndedPass:
    """What the Loader keeps of a pass whose iterator is gone: its position (state_dict() reports it) and
    whether it had started (Loader._reclaim)."""

    __slots__ = ("epoch", "position", "offset", "_start_position", "_done", "_stale", "_resumed", "_superseded_by",
                 "_hot")

    def __init__(self, it):
        for name in self.__slots__:
            setattr(self, name, getattr(it, name))
