"""What a dataset tells the Loader: the file columns the engine reads and how to pack a batch."""

class ColumnSource:
    """Base of the datasets the Loader reads (NpyDataset, TokenDataset).

    Subclasses provide ``_engine_columns()`` (one dict per file: path, data_offset, record_stride,
    record_bytes, num_records and, for token windows, token_bytes and token_signed),
    ``_engine_outputs()`` (per output tensor: dtype name and record shape) and ``_pack(tensors)``
    (the batch structure handed to the user).
    """

    def __len__(self):
        raise NotImplementedError

    def _engine_columns(self):
        raise NotImplementedError

    def _engine_outputs(self):
        raise NotImplementedError

    def _pack(self, tensors):
        raise NotImplementedError
