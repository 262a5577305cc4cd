"""Tar archives for the WebDataset tests and the tar fuzzer's seed corpus (tests/fuzz/make_corpus.py)."""

import io
import tarfile


def tar_bytes(members, format=tarfile.USTAR_FORMAT):
    """A tar archive of members [(name, data, or None for a directory)] in `format`."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=format) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()
