"""Loader features that involve a GPU; skipped cleanly on machines without one."""

import numpy as np
import pytest
import torch

import fastpipe

needs_gpu = pytest.mark.skipif(not fastpipe.build_info()["cuda_available"],
                               reason="needs a CUDA device and fastpipe built with CUDA")


def _dataset(tmp_path, n=301):
    x = np.random.default_rng().integers(0, 256, size=(n, 3, 17, 5), dtype=np.uint8)
    np.save(tmp_path / "x.npy", x)
    return x, fastpipe.NpyDataset(str(tmp_path / "x.npy"))


@pytest.mark.gpu
@needs_gpu
def test_pin_memory_release_waits_for_queued_copies(tmp_path, fp):
    """Each copy is queued behind a long kernel and its host batch dropped at once: the slot must not be
    refilled before the copy ran (stream-ordered release), or the device sees the next batch's bytes."""
    x, ds = _dataset(tmp_path, n=997)
    loader = fp.hooks(fastpipe.Loader(ds, batch_size=32, shuffle=True, pin_memory=True), poison=True)
    got = []
    for b in loader:
        assert b.is_pinned()
        torch.cuda._sleep(2_000_000)  # keeps the stream busy so the copy runs long after the release
        got.append(b.to("cuda", non_blocking=True))
        del b
    torch.cuda.synchronize()
    rows = torch.cat(got).cpu().numpy().reshape(len(x), -1)
    assert sorted(map(bytes, rows)) == sorted(map(bytes, x.reshape(len(x), -1)))


def test_pin_memory_without_gpu_warns(tmp_path):
    if fastpipe.build_info()["cuda_available"]:
        pytest.skip("a GPU is present: pinning works")
    _, ds = _dataset(tmp_path)
    with pytest.warns(UserWarning, match="not pinned"):
        fastpipe.Loader(ds, batch_size=8, pin_memory=True)
