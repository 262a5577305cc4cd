"""Loader: a drop-in replacement for torch.utils.data.DataLoader over on-disk tensor datasets."""

import os
import warnings
import weakref

import numpy as np

from fastpipe import _checks as checks
from fastpipe._ext import _C
from fastpipe.data import _collate, _dataloader_args, _device, batch_samplers
from fastpipe.data.order import REMAINDER_POLICIES, block_order, distributed_defaults, epoch_order, shard, shard_size
from fastpipe.data.passes import EpochIterator, OwnOrder, epoch_of
from fastpipe.data.resume import Resumable

IO_MODES = _C.ReaderConfig.choices["io"]

# Loader.stats() keys of a remote dataset's transfer counters (its fetch_stats).
_FETCH_STATS = {"bytes_fetched": "bytes_fetched", "fetch_requests": "requests", "fetch_retries": "retries",
                "cache_hits": "cache_hits", "network_seconds": "network_seconds",
                "network_wait_seconds": "blocked_seconds", "shards_evicted": "shards_evicted"}


def _close_reader(reader):
    reader.close()


class Loader(Resumable):
    """Batches of an on-disk dataset, read by C++ threads into a fixed arena, as zero-copy tensors.

    A drop-in replacement for ``torch.utils.data.DataLoader`` over :class:`NpyDataset`,
    :class:`TokenDataset`, :class:`ImageFolder` and :class:`ImageDataset`:
    ``for batch in Loader(ds, batch_size=256, shuffle=True): ...``.

    Parameters
    ----------
    dataset : NpyDataset, TokenDataset, ImageFolder, ImageDataset or WebDataset
        Or a ``torch.utils.data.Subset`` of one (``random_split``'s): its records are read, in positions of
        the Subset (a sampler's indices, ``len(loader.dataset)``), as DataLoader does; a ``ConcatDataset``
        of image folders reads as one ImageFolder of its parts' samples, of TensorDatasets as one
        TensorDataset (fastpipe/data/concat.py); a ``TensorDataset``'s tensors are written once as .npy
        columns (tensor_datasets.py). ``loader.dataset`` is the object given, whatever it is. torchvision's
        in-memory datasets (CIFAR10, CIFAR100, MNIST, ...) are written once as ``.npy`` columns under the
        cache and their pipelines fused into CropMirrorNormalize (fastpipe/data/torchvision_arrays.py).
        Other datasets can be converted once with :func:`fastpipe.write_npy` (tensors) or
        :func:`fastpipe.write_images` (images). A torchvision ``ImageFolder`` is taken as it is: its own
        sample list is read by :class:`fastpipe.ImageFolder` and its transform pipeline becomes the fused one
        (RandomResizedCrop or Resize + CenterCrop, RandomHorizontalFlip, ToTensor/ToImage + ToDtype,
        Normalize; a step without a fused equivalent is an error naming it).
    batch_size : int
        Records per batch (>= 1). The last batch may be smaller unless ``drop_last``.
    shuffle : bool or "blocks"
        Shuffle each epoch; the order is a pure function of ``(seed, epoch)``. ``"blocks"`` (a WebDataset):
        the shards in an order shuffled each epoch, read through a window of ``shuffle_window`` bytes of
        shards that slides a shard at a time, every batch drawn from all of the window's shards (what data
        larger than memory or a cache needs: readers hold one window's shards at once; every rank its
        exact share, resume and elastic resume as for a full shuffle). Its quality is the window's: shards
        written class by class give each batch the classes of the window's shards (benchmarks/
        shuffle_quality.py measures how large a window must be).
    shuffle_window : int or str
        ``shuffle="blocks"``: the bytes of shards a window holds (``"1GiB"``, the default; at least one
        shard): the number of shards a window takes is this over the shards' mean size.
    seed : int
        Seed of the shuffle. The same seed gives the same batches whatever ``num_threads``.
    drop_last : bool
        Drop the last incomplete batch.
    device : str or torch.device
        ``"cpu"``, or ``"cuda"`` (the current CUDA device at construction) / ``"cuda:k"``: batches are
        copied from page-locked host slots into a fixed device arena on a copy stream of the Loader's,
        converted there (token windows widened, ``transforms`` applied), and handed out as CUDA tensors
        that the current stream waits for (the host never does). Use :func:`fastpipe.record_stream`
        when a batch is also used on another stream.
    num_threads : int, optional
        Reader threads; default: the cores, between 2 and 8, or for image datasets (decoding is
        CPU-bound) every core but the training loop's, at least 2 (at least 16 when reading with
        O_DIRECT, whose threads mostly wait on the device). 0: no reader threads; ``next()`` reads each
        batch when it is asked for, its records spread over torch's intra-op threads
        (``torch.get_num_threads()``).
        For a training step that itself keeps every core busy with torch ops (CPU training with torch's
        default threads), where reader threads would compete with it for the cores; CPU batches only.
        Unset (CPU batches): reader threads, and the loader watches the CPU the training step uses
        (every thread but its readers, per second, over windows of >= 2 batches and 20 ms). While the
        step leaves less than half a core idle, ``next()`` reads the batches on torch's threads as with
        0, and the readers wait; they are tried again after 64 to 512 batches.
        ``stats()["gathering_in_next"]``, ``["next_batches"]`` and ``["step_cores"]`` show the choice.
        Reader threads keep off the core the training loop takes its batches on while the other cores
        leave them ample time (they were busy at most 3/4 of them over a window), so that they do not
        evict the training thread's caches while it sleeps or waits on the GPU; they take every core
        again once the loop waits for them. ``stats()["spare_cpu"]``, ``["spared_batches"]`` and
        ``["reader_cores"]`` show it.
    prefetch : int, optional
        Batches read ahead of the training loop (>= 1). The arena holds ``prefetch + 2`` batches.
        Default: enough batches for about 8 MiB of read-ahead, between 2 and 16 (small batches need a
        deeper queue to keep the readers busy between the training loop's requests).
    rank, world_size : int, optional
        Distributed shard; default to torch.distributed's when it is initialised.
    shard_remainder : {"pad", "drop"}
        When the dataset does not divide by ``world_size``: "pad" repeats a few samples so that every
        sample is read at least once (like DistributedSampler), "drop" leaves out the remainder so that
        none is read twice. Either way every rank gets the same number of batches.
    io : {"auto", "mmap", "pread", "direct"}
        How records are read. "mmap" gathers small records from a mapping, "pread" reads with
        pread(2) (sequential runs coalesced), "direct" bypasses the page cache with O_DIRECT (falls back
        to buffered reads, with a warning, where the filesystem refuses it). "auto" uses direct for
        records of 64 KiB or more when the data exceeds half the available memory, else mmap.
    timeout : float or None
        Seconds to wait for a batch before raising TimeoutError (None or 0: wait forever). The
        ``timeout`` attribute may be changed later; it applies from the next batch on. Every wait
        (``next()``, a new pass's ``iter()``, ``close()``) releases the GIL and checks for Ctrl-C every
        50 ms; a device call that never returns is left behind by ``close()`` (reported once on stderr).
    sampler : iterable of int, optional
        A custom epoch order (as DataLoader's ``sampler``), iterated once per ``iter()``. Its epoch is
        yours: fastpipe calls its ``set_epoch`` only from :meth:`set_epoch`. A sampler with an ``epoch``
        (DistributedSampler and the like) decides each pass's order and the transforms' random draws
        with it: call ``sampler.set_epoch(epoch)`` every epoch, as with DataLoader (a run resumed at
        epoch 5 then gets epoch 5's order and draws; a sampler never told its epoch repeats both).
    collate_fn : callable, optional
        ``default_collate`` (torch's, under any of its import paths) is what the Loader does anyway: the
        batch as it is. Any other function is called with the batch as DataLoader hands it over, a list
        of per-sample items (views into the batch: ``(image, label)`` with ``label`` an int for image
        datasets; a tuple, dict or tensor per record for the others), and what it returns is what the
        loop receives. A collate that stacks (e.g. torchvision's references' ``MixUp``/``CutMix`` after
        ``default_collate(batch)``) copies the batch once; applying MixUp/CutMix to the batch in the loop
        (``images, labels = cutmix(images, labels)``) does not.
    when_full : {"allocate", "error"}
        When the program holds every slot of the arena (e.g. ``list(loader)``) the next batch cannot go
        there: "allocate" reads it into memory outside the arena that torch frees like any tensor
        (counted in ``stats()["overflow_batches"]``, with one warning), "error" raises at once.
    transforms : dict, optional
        ``{field: transform}`` (:mod:`fastpipe.transforms`, e.g. ``CropMirrorNormalize``) applied to a
        field of every batch as it is read: a dict dataset's name, or a tuple dataset's position (0 for a
        single-tensor dataset). Random choices depend on ``seed``, the epoch and the sample only. For
        an image dataset, ``{0: RandomResizedCrop(224)}`` (or ``"image"``) overrides its ``transform``.
    on_error : {"raise", "replace"}
        An image that cannot be read or decoded (corrupt, truncated, not an image, deleted): "raise" fails
        its batch with an error naming the file and why; "replace" substitutes another sample, drawn from
        (seed, epoch, sample) so runs still reproduce, counted in ``stats()["images_replaced"]`` (the first
        ones listed in ``stats()["replaced"]``) with one warning. Rows of an image below its crop are not
        decoded, so damage there shows only in an epoch whose crop reaches it.
    image_decode : {"auto", "host", "device"}
        Where a CUDA loader decodes JPEGs: "host" in the reader threads (then the decoded batch is
        copied), "device" with nvJPEG on the GPU (its hardware JPEG engines where it has them), the reader
        threads decoding only what nvJPEG is not given (progressive or unusual JPEGs, images over the
        per-record budgets, shrinks of more than 4x, which DCT scaling makes cheap on the CPU). "auto"
        is $FASTPIPE_IMAGE_DECODE, else "host": the device path stays off until its tests have passed
        on a GPU. With "device", ``on_error="replace"`` is refused: only the reader threads substitute
        a bad image, and one that nvJPEG and then libjpeg refuse fails its batch, naming the sample.

    DataLoader's other keywords are mapped: ``num_workers`` sets the number of reader threads and leaves
    the choice of where to read automatic, as with ``num_threads`` unset (its default, 0, leaves the
    default reader threads: ``num_threads=0``, reading in ``next()``, is asked for by name); ``prefetch_factor``
    sets ``prefetch`` to ``prefetch_factor * max(1, num_workers)`` (DataLoader's batches in flight);
    ``generator`` sets ``seed`` from its initial seed; ``persistent_workers`` and ``in_order`` are what
    fastpipe always does; ``pin_memory`` page-locks the arena (once, at construction), so that
    ``batch.to("cuda", non_blocking=True)`` is asynchronous; a slot is refilled only after the copies
    queued from its batch on ``pin_memory_device``'s current stream (default: the current device) are
    done, and on other streams that :func:`fastpipe.record_stream` names (without a usable CUDA device
    it warns once per process and pins nothing). ``batch_sampler`` gives the batches: torch's
    ``BatchSampler`` as its sampler, batch size and drop_last, another one as the indices of its batches in
    turn, which must all have its ``batch_size`` attribute's length but the last (the arena's slots are sized
    once; a batch of another size raises, naming it). ``worker_init_fn`` and ``multiprocessing_context`` are
    taken and not used, as DataLoader does with ``num_workers=0``: there are no worker processes, no code of
    yours runs in the reader threads, and the random transforms draw from ``seed`` (or ``generator``), not
    from the generators a ``worker_init_fn`` seeds.

    Notes
    -----
    Batch tensors view the loader's arena: nothing is copied after the read. A slot is reused only
    when every tensor, view and numpy array of its batch has been freed, so holding batches is safe;
    holding more than ``prefetch + 2`` stalls the loader and, after ``timeout``, raises an error
    that says so (copy batches you keep with ``.clone()``).
    """

    def __init__(self, dataset, batch_size=1, shuffle=False, *, seed=0, shuffle_window="1GiB", drop_last=False, device="cpu",
                 num_threads=None, prefetch=None, rank=None, world_size=None, shard_remainder="pad", io="auto",
                 timeout=120.0, sampler=None, generator=None, num_workers=0, pin_memory=False,
                 prefetch_factor=None, persistent_workers=False, collate_fn=None, worker_init_fn=None,
                 batch_sampler=None, multiprocessing_context=None, pin_memory_device="", in_order=True,
                 transforms=None, when_full="allocate", on_error="raise", image_decode="auto"):
        source, self._records, transforms = _dataloader_args.source_of(dataset, transforms)
        _dataloader_args.accept_unused(persistent_workers=persistent_workers, in_order=in_order)
        sampler, batch_size, drop_last = batch_samplers.from_batch_sampler(
            batch_sampler, batch_size=batch_size, shuffle=shuffle, sampler=sampler, drop_last=drop_last)
        self.collate_fn = _collate.checked(collate_fn)
        self.device, reader_device = _device.resolve(device)
        checks.choice(image_decode, "image_decode", ("auto", "host", "device"))
        checks.choice(shard_remainder, "shard_remainder", REMAINDER_POLICIES)
        # DataLoader's default is None
        shuffle = False if shuffle is None else shuffle if shuffle == "blocks" else checks.flag(shuffle, "shuffle")
        self._blocks = None  # shuffle="blocks": (the samples where blocks start, their shards, blocks a window)
        if shuffle == "blocks":
            blocks = getattr(source, "_blocks", None)
            if blocks is not None and self._records is not None:
                raise ValueError("shuffle='blocks' reads whole shards of a WebDataset; a Subset of it picks records "
                                 "out of them: use shuffle=True")
            if blocks is None:
                raise ValueError(f"shuffle='blocks' shuffles the shards of a sharded dataset (WebDataset); "
                                 f"{type(dataset).__name__} has none: use shuffle=True")
            starts, shards, block_bytes = blocks()
            window = checks.byte_size(shuffle_window, "shuffle_window")
            self._blocks = (starts, shards, max(1, int(window // max(1.0, block_bytes))))
        if hasattr(source, "_check_order"):
            source._check_order(shuffle, shuffle_window, self._blocks[2] if self._blocks else None)
        drop_last = checks.flag(drop_last, "drop_last")
        if sampler is not None:
            if shuffle:
                raise ValueError("sampler and shuffle=True are exclusive (as in DataLoader): the sampler sets the "
                                 "order")
            if not hasattr(sampler, "__iter__") or not hasattr(sampler, "__len__"):
                raise TypeError(f"sampler must be an iterable of indices with a len(), got {type(sampler).__name__}")
        if len(dataset) == 0:
            raise ValueError(f"the dataset is empty: {dataset!r}")
        num_threads, gather = _dataloader_args.reader_threads(num_threads, num_workers, reader_device is not None)
        prefetch = _dataloader_args.reader_prefetch(prefetch, prefetch_factor, num_workers)
        seed = _dataloader_args.seed_of(seed, generator)
        # Defaults and checks of the reader's settings are C++'s (csrc/core/reader_config.h).
        config = _C.ReaderConfig(batch_size=batch_size, num_threads=num_threads, prefetch=prefetch, io=io,
                                 gather=gather, when_full=when_full, on_error=on_error, seed=seed)
        batch_size, seed = config.batch_size, config.seed
        pin = _dataloader_args.pinning(pin_memory, pin_memory_device, reader_device)
        self.dataset = dataset  # as DataLoader's: what was given (a Subset, a torchvision or torch dataset), of
        # the length of `source`'s records read
        self._source = source  # the fastpipe dataset read
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self._sampler = sampler  # the user's; the `sampler` property also stands for the Loader's own order
        self.batch_sampler = batch_sampler
        self.rank, self.world_size = distributed_defaults(rank, world_size)
        self.shard_remainder = shard_remainder
        self._pass = None  # the current pass: a weak reference to its iterator, or an EndedPass
        self.timeout = timeout
        self.epoch = 0
        self._resume = None  # (epoch, batches to skip, offset) from load_state_dict
        if transforms and not isinstance(transforms, dict):
            raise TypeError("transforms must be a dict {field: transform} (field: a dict dataset's name, or a "
                            f"tuple dataset's position), got {type(transforms).__name__}")
        if image_decode == "device" and not source._decodes_images:
            raise ValueError(f"image_decode='device' decodes JPEG images; {type(source).__name__} has none")
        device_decode = source._decodes_images and _device.image_decoder(image_decode, reader_device)
        columns, outputs = source._reader_columns(dict(transforms or {}), self.seed, device_decode)
        self.transforms = dict(transforms or {})
        self.on_error = on_error
        self._reader_args = dict(
            columns=columns, outputs=outputs, config=config, pin=pin, device=reader_device,
            nvjpeg=_device.nvjpeg_library() if isinstance(reader_device, int) else "", pack=source._reader_pack,
        )
        self._open_reader()
        for w in self._reader.warnings():
            warnings.warn(w, stacklevel=2)
        self.io_modes = self._reader.io_modes()

    @property
    def timeout(self):
        """Seconds ``next()`` waits for a batch before TimeoutError (None: forever); may be changed."""
        return None if self._timeout < 0 else self._timeout

    @timeout.setter
    def timeout(self, value):
        if value is not None:
            value = checks.real(value, "timeout", low=0.0, allow_inf=True)
        self._timeout = -1.0 if not value or value == float("inf") else value
        if self._active is not None:
            self._active._hot = False  # its next batch takes the new timeout (EpochIterator._next_checked)

    @property
    def _active(self):
        """The current pass: its iterator while it lives, else the EndedPass it left, or None."""
        p = self._pass
        return p() if isinstance(p, weakref.ref) else p

    @_active.setter
    def _active(self, it):
        self._pass = None if it is None else it._ref

    def _open_reader(self):
        self._reader = _C.BatchReader(**self._reader_args)
        self._pid = os.getpid()
        self._finalizer = weakref.finalize(self, _close_reader, self._reader)

    # -- order -------------------------------------------------------------------------------------

    def _num_samples(self):
        if self._sampler is not None:
            return len(self._sampler)
        return shard_size(len(self.dataset), world_size=self.world_size, remainder=self.shard_remainder)

    def __len__(self):
        n = self._num_samples()
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _indices(self, epoch, offset=0):
        """The records of the pass of ``epoch`` (its first ``offset`` samples skipped), this rank's."""
        positions = self._positions(epoch, offset)
        return positions if self._records is None else self._records[positions]

    def _positions(self, epoch, offset=0):
        """As ``_indices``, in positions of ``dataset`` (a Subset's, before they name its records)."""
        if self._sampler is not None:
            idx = np.fromiter(iter(self._sampler), dtype=np.int64)
            if len(idx) and (idx.min() < 0 or idx.max() >= len(self.dataset)):
                raise ValueError(f"sampler yielded index {idx.min() if idx.min() < 0 else idx.max()}, out of range "
                                 f"for a dataset of {len(self.dataset)} records")
            return idx
        if self._blocks is not None:
            starts, shards, window = self._blocks
            order = block_order(starts, len(self.dataset), seed=self.seed, epoch=epoch, window=window, groups=shards)
        else:
            order = epoch_order(len(self.dataset), shuffle=self.shuffle, seed=self.seed, epoch=epoch)
        order = order[offset:]
        return shard(order, rank=self.rank, world_size=self.world_size, remainder=self.shard_remainder)

    @property
    def sampler(self):
        """The ``sampler`` given, else the Loader's own order as a sampler (``set_epoch``, ``__iter__``,
        ``__len__``): trainers that set the epoch of a loader's sampler (Lightning does at each epoch) set
        the Loader's."""
        return self._sampler if self._sampler is not None else OwnOrder(self)

    def set_epoch(self, epoch):
        """Sets the epoch of the next iteration (its shuffle, and the transforms' random draws); later
        iterations count on from it. With a ``sampler`` that has ``set_epoch`` (DistributedSampler), it is
        called with ``epoch``: that is the only time fastpipe calls it.

        Like a new ``iter()`` or :meth:`load_state_dict`, this ends the pass in progress: its iterator
        raises if used again, and :meth:`state_dict` reports ``(epoch, 0)``; an iterator that has yielded
        no batch yet stays valid and starts from the new position instead (as DataLoader draws its order
        at the first batch: Lightning calls ``iter()`` before it sets the epoch). After
        :meth:`load_state_dict`, setting the epoch it loaded keeps its position, so that a resumed script
        looping ``for epoch in range(start, n): loader.set_epoch(epoch)`` continues where it stopped;
        another epoch starts at its first batch.
        """
        epoch = checks.integer(epoch, "epoch", low=0)
        fresh = self._reclaim()
        self.epoch = epoch
        if self._sampler is not None and callable(getattr(self._sampler, "set_epoch", None)):
            self._sampler.set_epoch(self.epoch)
        if self._resume is not None and self._resume[0] != self.epoch:
            self._resume = None
        if not fresh:
            self._supersede("set_epoch()")

    def _supersede(self, by):
        """Ends the current pass's iterator (it raises when used again): ``by`` set a new position."""
        if self._active is not None:
            self._active._superseded_by = by
            self._active._hot = False
            self._active = None

    # -- iteration ---------------------------------------------------------------------------------

    def __iter__(self):
        if self._pid != os.getpid():
            # A forked child cannot use the parent's reader threads: open a fresh reader here.
            self._open_reader()
        self._reclaim()
        self._supersede("a newer iter() of the same Loader")
        it = EpochIterator(self)
        self._start(it)
        self._active = it
        return it

    def _start(self, it):
        """Starts iterator ``it``'s pass: reading ahead begins now."""
        seen = epoch_of(self._sampler)
        if seen is not None:
            # The user's sampler.set_epoch(e) (the references' train_sampler.set_epoch(epoch)) decides the
            # order; the transforms' draws follow that epoch too, so that a resumed run redraws them.
            if self._resume is not None and self._resume[0] != seen:
                self._resume = None
            self.epoch = seen
        epoch = self.epoch
        skip = offset = 0
        if self._resume is not None and self._resume[0] == epoch:
            skip, offset = self._resume[1], self._resume[2]
        indices = self._indices(epoch, offset)[skip * self.batch_size:]
        it._resumed, self._resume = self._resume, None
        self.epoch = epoch + 1
        if hasattr(self._source, "_plan"):  # remote shards: fetched ahead in this pass's order, then the next's
            following = None if self._sampler is not None else lambda: self._indices(epoch + 1)
            self._source._plan(indices, following, self._blocks[2] if self._blocks is not None else 1)
        self._reader.start(indices, self.drop_last, epoch % (1 << 64), self._timeout)
        it.epoch, it.position, it._start_position, it._stale, it.offset = epoch, skip, skip, False, offset
        it._hot = False

    def _reclaim(self):
        """Takes the live pass back while it has yielded no batch, as if it had not started: True then.
        Its iterator stays valid and starts again from the Loader's position at its first next(), so that
        an epoch set between iter() and the first batch counts, as with DataLoader (Lightning calls iter()
        before it sets the epoch of the loader's sampler)."""
        it = self._active
        if it is None or it.position != it._start_position or it._done:
            return False
        if not it._stale:
            self.epoch, self._resume = it.epoch, it._resumed
            it._stale = True
        return True

    # -- statistics and lifetime -------------------------------------------------------------------

    def stats(self):
        """Counters since the first iteration.

        Returns
        -------
        dict
            batches, bytes_read, wall_seconds (time inside iterations: from each ``iter()`` to its
            last batch), read_gbps (bytes_read / wall_seconds), read_seconds (summed over reader
            threads), wait_seconds (the training loop blocked waiting for data), wait_fraction
            (wait_seconds / wall_seconds), arena_bytes (the fixed memory budget), prefetch, num_slots,
            slots_leased (batches the program still holds), num_threads, waits (batches the
            training loop asked for before they were ready), overflow_batches (read outside the arena
            because the program held every slot), next_batches (read by ``next()`` itself, on torch's
            threads), helped_chunks (chunks ``next()`` read while it waited for the reader threads),
            stepped_back (times a reader thread polled instead of reading while ``next()`` read, where
            the reader threads and ``next()`` would have outnumbered the cores; never with an
            ``io='direct'`` column, whose readers wait on the device),
            gathering_in_next (where the next batches are read), step_cores (unset
            ``num_threads``: the cores the training step used in the last window; None before one),
            spare_cpu (the core the reader threads keep off now: the training loop's; None: none),
            spared_batches (taken while they kept off it), parked_readers (reader threads beyond the
            cores left to them, waiting while the others keep off the training loop's core; never with
            an ``io='direct'`` column), reader_cores (seconds the readers spent
            reading per second of the last window, summed over them: the cores they kept busy, more
            when they shared cores; None before one),
            images_replaced and replaced (on_error="replace": how many bad images were substituted, and
            the first of them: which, why, by what), images_pillow (images of formats without a decoder
            in the reader threads, decoded by Pillow holding the GIL: BMP, GIF, TIFF, ...),
            and with ``image_decode="device"`` images_decoded_on_device, images_decoded_on_host (those
            the device was not given: progressive, CMYK, over the budgets, shrunk more than 4x) and
            images_decoded_planar (those nvJPEG decoded into YCbCr planes, whose upsampling and colour
            conversion are libjpeg's: the host path's colours; else nvJPEG's interleaved RGB),
            images_decoded_after_refusal (of those on the device, in batches nvJPEG refused as corrupt:
            decoded by libjpeg in the loader's device thread instead; a file libjpeg refuses too fails
            its batch), and jpeg_decoder (nvJPEG's backend and the layout it writes, decided once for
            both decode lanes: planar YCbCr, or interleaved RGB and why).
            Remote data (0 for local data), since the dataset was made (its construction included):
            bytes_fetched, fetch_requests, fetch_retries, cache_hits (shards found in the cache),
            network_seconds (spent transferring), and for streamed WebDataset shards
            network_wait_seconds (reader threads waiting for a shard to arrive, summed over them) and
            shards_evicted (to keep the cache under its limit).
        """
        s = self._reader.stats()
        wall = s["wall_seconds"]
        s["read_gbps"] = s["bytes_read"] / wall / 1e9 if wall > 0 else 0.0
        s["wait_fraction"] = s["wait_seconds"] / wall if wall > 0 else 0.0
        fetched = getattr(self._source, "fetch_stats", None) or {}
        for key, name in _FETCH_STATS.items():
            s[key] = fetched.get(name, 0)
        return s

    def close(self):
        """Stops the reader threads and closes the files. Batches already returned stay valid."""
        if self._active is not None and not self._active._done and not self._active._stale:
            self._resume = (self._active.epoch, self._active.position, self._active.offset)  # state_dict() reports it
        self._active = None
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        dataset = repr(self._source) if self._records is None else f"Subset({len(self._records)} of {self._source!r})"
        return (f"Loader({dataset}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
                f"rank={self.rank}/{self.world_size}, io={self.io_modes})")
