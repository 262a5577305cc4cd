"""What a dataset tells the Loader: the file columns the batch reader reads and how to pack a batch."""

from fastpipe import _checks as checks
from fastpipe.data import _collate

class ColumnSource:
    """Base of the datasets the Loader reads (NpyDataset, TokenDataset, ImageFolder, ImageDataset).

    Subclasses provide ``_columns()`` (one ``_C.ColumnSpec`` per file: path, data_offset,
    record_stride, record_bytes, num_records and, for token windows, token_bytes and token_signed),
    ``_outputs()`` (per output tensor: dtype name and record shape) and ``_pack(tensors)``
    (the batch structure handed to the user), which the reader's next() makes itself where
    ``_reader_pack`` says it is one of its own: "tensor" (the one output) or "tuple" (every output).
    """

    _len = 0
    _reader_pack = "list"  # the reader returns the list of outputs and _pack makes the batch
    _unit = "records"
    _decodes_images = False  # JPEG records: the Loader's image_decode applies

    def __len__(self):
        return self._len

    def _index(self, i):
        """``i`` as a non-negative index; IndexError when out of range (negative counts from the end)."""
        i = checks.integer(i, "index")
        if not -self._len <= i < self._len:
            raise IndexError(f"index {i} is out of range for a dataset of {self._len} {self._unit}")
        return i % self._len

    def _columns(self):
        raise NotImplementedError

    def _outputs(self):
        raise NotImplementedError

    def _pack(self, tensors):
        raise NotImplementedError

    def _items(self, batch):
        """A packed batch as DataLoader hands it to a ``collate_fn``: the list of its samples (views)."""
        return _collate.items(batch)

    def _reader_columns(self, transforms, seed, device_decode=False):
        """``(columns, outputs)`` for a Loader with ``transforms`` ({field: transform}, maybe empty) and
        ``seed``; ``device_decode``: images are decoded on the Loader's device (image datasets only)."""
        if transforms:
            return self._with_transforms(transforms, seed)
        return self._columns(), self._outputs()

    def _with_transforms(self, transforms, seed):
        """``(columns, outputs)`` with the given transforms applied ({field: transform}); the fields are
        what the batch structure indexes: names of a dict dataset, positions of a tuple one, 0 for one
        tensor."""
        raise ValueError(f"{type(self).__name__} takes no transforms")
