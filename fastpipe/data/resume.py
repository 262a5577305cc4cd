"""A Loader's position: the state_dict it saves and the load_state_dict that resumes it, in the same world
or another one (the rest of an epoch split over the new ranks)."""

from fastpipe import _checks as checks
from fastpipe.data.order import shard_size

_STATE_FORMAT = "fastpipe.Loader/1"
# State keys that must match for a saved position to mean the same samples.
# Not the rank: every rank is at the same batch, so one rank's state resumes them all (Lightning
# checkpoints rank 0's and hands it to every rank). Not the world size: another one resumes the rest of
# the epoch split over its ranks (load_state_dict).
_STATE_IDENTITY = ("num_samples", "batch_size", "shuffle", "blocks", "shuffle_window", "seed", "drop_last",
                   "shard_remainder")


class Resumable:
    """The Loader's position methods (a mixin: they read the Loader's order settings, its live iterator
    and its pending resume)."""

    def _pass_batches(self, offset, world_size=None):
        """Batches per rank of a pass that starts `offset` samples into its epoch's order (an epoch resumed
        with another world size; 0: a whole epoch)."""
        if offset == 0 and world_size in (None, self.world_size):
            return len(self)
        n = shard_size(len(self.dataset) - offset, world_size=world_size or self.world_size,
                       remainder=self.shard_remainder)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def state_dict(self):
        """The loader's position as a JSON-serialisable dict (see :meth:`load_state_dict`).

        The position is that of the next batch: of the live iterator while one is in progress (also
        after a ``break`` out of it: continuing it yields that batch), else the first batch of the next
        ``iter()``. After an epoch's last batch it is the next epoch's first batch.
        """
        if self._resume is not None:
            epoch, batch, offset = self._resume
        elif self._active is not None and not self._active._done and not self._active._stale:
            epoch, batch, offset = self._active.epoch, self._active.position, self._active.offset
        else:
            epoch, batch, offset = self.epoch, 0, 0
        if batch >= self._pass_batches(offset):  # after the last batch, the next batch is the next epoch's first
            epoch, batch, offset = epoch + 1, 0, 0
        return {
            "format": _STATE_FORMAT, "epoch": epoch, "batch": batch, "offset": offset,
            "num_samples": len(self.dataset), "batch_size": self.batch_size, "shuffle": self.shuffle,
            "blocks": len(self._blocks[0]) if self._blocks is not None else None,
            "shuffle_window": self._blocks[2] if self._blocks is not None else None,
            "seed": self.seed, "drop_last": self.drop_last, "rank": self.rank, "world_size": self.world_size,
            "shard_remainder": self.shard_remainder,
        }

    def load_state_dict(self, state):
        """Resumes from :meth:`state_dict`: the next iteration yields exactly the remaining batches.

        A state saved by another rank of the same ``world_size`` resumes this one too (every rank is at
        the same batch: Lightning checkpoints rank 0's state and hands it to every rank). A state saved with
        another ``world_size`` (torchrun restarting on fewer or more nodes) resumes the rest of that epoch
        split over this world's ranks: the samples of the epoch's order that the saved ranks had not read,
        each once (with ``shard_remainder="pad"`` a few twice, so that every rank reads as many), none of
        those they had read; later epochs are whole. The state's ``offset`` counts the epoch's samples read
        before its pass began. With a ``sampler`` the world size must match (the sampler decides the
        order)."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from Loader.state_dict(), got {type(state).__name__}")
        if state.get("format") != _STATE_FORMAT:
            raise ValueError(f"not a fastpipe Loader state (expected format {_STATE_FORMAT!r})")
        mine = self.state_dict()
        for key in _STATE_IDENTITY:
            if state.get(key) != mine[key]:
                raise ValueError(f"state_dict was saved with {key}={state.get(key)!r} but this loader has "
                                 f"{key}={mine[key]!r}; resuming would yield different batches")
        epoch = checks.integer(state.get("epoch"), "state['epoch']", low=0)
        batch = checks.integer(state.get("batch"), "state['batch']", low=0)
        offset = checks.integer(state.get("offset", 0), "state['offset']", low=0, high=len(self.dataset),
                                why=" (the dataset's size)")
        world = checks.integer(state.get("world_size"), "state['world_size']", low=1)
        if world != self.world_size and self._sampler is not None:
            raise ValueError(f"state_dict was saved with world_size={world} but this loader has "
                             f"world_size={self.world_size}, and its sampler decides the order: resume with the "
                             f"saved world size")
        batches = self._pass_batches(offset, world)
        if batch > batches:
            raise ValueError(f"state_dict batch {batch} is out of range for {batches} batches per epoch")
        if world != self.world_size:  # the rest of the epoch's order, split over this world's ranks
            if batch == batches:
                epoch, batch, offset = epoch + 1, 0, 0
            else:
                batch, offset = 0, offset + world * batch * self.batch_size
        fresh = self._reclaim()
        self.epoch = epoch
        self._resume = (epoch, batch, offset)
        if not fresh:
            self._supersede("load_state_dict()")
