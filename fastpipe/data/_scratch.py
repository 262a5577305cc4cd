"""Arrays a dataset writes for its readers (a TensorDataset's tensors, an image dataset's labels), as .npy
files that no process outlives: each is unlinked as soon as it is made and read through
``/proc/self/fd/<n>`` while its owner lives (a forked child inherits the descriptor, so the path holds
there too). A named temporary folder, removed when its dataset was freed, stayed behind whenever the
process was killed first: a training run killed -9 left its TensorDataset's copy in the temporary folder."""

import os
import tempfile
import weakref

import numpy as np


class ScratchArrays:
    """.npy files open while this lives (keep it on their owner: ``dataset._scratch``), closed, and so gone,
    when it is freed or the process ends."""

    def __init__(self):
        self._fds = []
        weakref.finalize(self, _close_all, self._fds)

    def add(self, array, what):
        """Writes ``array`` (``what``: for messages) as a .npy file; returns the path that reads it."""
        folder = tempfile.gettempdir()
        try:
            fd, path = tempfile.mkstemp(prefix="fastpipe-", suffix=".npy", dir=folder)
            self._fds.append(fd)
            os.unlink(path)
            with os.fdopen(os.dup(fd), "wb") as f:
                np.save(f, array)
        except OSError as e:
            raise OSError(e.errno, f"writing {what} ({array.nbytes:,} bytes) for the reader threads into the "
                                   f"temporary folder {folder} failed: {e.strerror}; set TMPDIR to a folder with "
                                   f"room for it") from e
        return f"/proc/self/fd/{fd}"


def _close_all(fds):
    for fd in fds:
        os.close(fd)
    fds.clear()
