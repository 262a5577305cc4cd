"""The training suite: its data, models and measurements, and a short real run that must train."""

import glob
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import fastpipe.nn as fnn
from fastpipe.bench import models, train


def test_generated_images_encode_their_label(tmp_path):
    paths = train.ensure_data(str(tmp_path), "t", 37, 9, seed=3)
    images, labels = np.load(paths["image"]), np.load(paths["label"])
    assert images.shape == (37, 3, 9, 9) and images.dtype == np.uint8 and labels.dtype == np.int64
    assert set(np.unique(labels)) <= set(range(train.NUM_CLASSES)) and len(np.unique(labels)) > 3
    # Each image is nearest to the mean image of its own label: the loss can fall.
    flat = images.reshape(37, -1).astype(np.float64)
    centres = {c: flat[labels == c].mean(0) for c in np.unique(labels)}
    nearest = [min(centres, key=lambda c: np.abs(row - centres[c]).sum()) for row in flat]
    assert (np.array(nearest) == labels).all()
    before = os.stat(paths["image"]).st_mtime_ns
    assert train.ensure_data(str(tmp_path), "t", 37, 9, seed=3) == paths
    assert os.stat(paths["image"]).st_mtime_ns == before  # reused, not rewritten
    assert np.load(train.ensure_data(str(tmp_path), "t", 40, 9)["image"]).shape[0] == 40  # wrong size: remade


@pytest.mark.parametrize("name", list(models.MODELS))
@pytest.mark.parametrize("size", [32, 112])
def test_models_classify_any_image_size_and_fuse_in_eval(name, size):
    torch.manual_seed(0)
    m = models.MODELS[name](num_classes=7, image_size=size, width=0.25).eval()
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        want = m(x)
        fused = fnn.fuse(m)
        got = fused(x)
    assert want.shape == (2, 7)
    assert len(fused.fuse_report.fused) > 5  # their conv -> BN -> act chains are what fuse() rewrites
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


def test_cpu_time_counts_child_processes():
    before = train.tree_cpu_seconds()
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.4: pass\ninput()"],
                             stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while train.tree_cpu_seconds() - before < 0.3:  # the busy child, not this process, adds the time
            assert time.monotonic() < deadline, "a busy child's CPU time never showed"
    finally:
        child.communicate(b"\n", timeout=30)


def _feed_batches(feed, paths, batch):
    o = {"device": torch.device("cpu"), "gpu": False, "workers": 2, "seed": 1}
    gen = train.FEEDS[feed](paths, o, batch)
    try:
        return [next(gen) for _ in range(3)]
    finally:
        gen.close()


def test_every_feed_gives_the_same_kind_of_batch(tmp_path):
    paths = train.ensure_data(str(tmp_path), "t", 50, 12)
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (train.MEAN, train.STD))
    lo, hi = (0 - mean) / std, (1 - mean) / std
    labels = torch.from_numpy(np.load(paths["label"]))
    for feed in train.FEEDS:
        for x, y in _feed_batches(feed, paths, 8):
            assert x.shape == (8, 3, 12, 12) and x.dtype == torch.float32, feed
            assert ((x >= lo - 1e-5) & (x <= hi + 1e-5)).all(), feed
            assert y.dtype == torch.int64 and set(y.tolist()) <= set(labels.tolist()), feed
    # stock and fastpipe normalise alike: the same record gives the same values (or their mirror image)
    images = torch.from_numpy(np.load(paths["image"])).float().div(255).sub(mean).div(std)
    for feed in ("stock", "fastpipe"):
        (x, _), *_ = _feed_batches(feed, paths, 8)
        for img in x:
            assert any(torch.allclose(img, ref, atol=1e-5) or torch.allclose(img, ref.flip(2), atol=1e-5)
                       for ref in images), feed


def test_a_short_run_trains_and_reports(tmp_path):
    """Not the quick mode: enough steps for the training check, on a tiny net, two repetitions (two
    augmentation seeds: the check's noise)."""
    cmd = [sys.executable, "-m", "fastpipe.bench", "train", "--models", "resnet", "--datasets", "cifar",
           "--steps", "25", "--warmup", "2", "--batch-size", "32", "--width", "0.125", "--workers", "2",
           "--reps", "2", "--out-dir", str(tmp_path / "out"), "--data-dir", str(tmp_path / "data"), "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = glob.glob(str(tmp_path / "out" / "train_*.json"))
    with open(path) as f:
        results = json.load(f)["results"]
    (case,) = results["cases"]
    assert set(case["rows"]) == {"stock", "fastpipe", "synthetic"}
    for feed, row in case["rows"].items():
        assert row["images_per_s"] > 0 and 0 <= row["data_wait_pct"] <= 100, (feed, row)
        assert row["cpu_s_per_step"] > 0 and row["peak_mem_bytes"] > 0, (feed, row)
        assert np.isfinite([row["loss_first"], row["loss_last"]]).all(), (feed, row)
        assert len(row["images_per_s_reps"]) == len(row["loss_last_reps"]) == 2, (feed, row)
    assert case["rows"]["synthetic"]["data_wait_pct"] < 5  # one batch, already there
    check = case["check"]
    assert check["status"] == "as stock" and check["stock_learns"] and check["losses_agree"], check
    assert check["reps"] == 2 and check["tolerance"] >= train.LOSS_AGREES * check["stock_drop"] > 0, check
    assert case["loss_falls"] is True and case["losses_agree"] is True, case
    assert results["summary"]["all_train"] is True and results["summary"]["reps"] == 2
    assert len(case["fastpipe_over_stock_reps"]) == 2
    assert case["fastpipe_over_stock"] == pytest.approx(np.median(case["fastpipe_over_stock_reps"]))
    assert "fastpipe / stock" in proc.stdout and "as stock (loss" in proc.stdout
    assert "over 2 reps" in results["headline"][0]
    assert glob.glob(str(tmp_path / "out" / "train_*.md"))


def _run(first, last):
    return {"loss_first": first, "loss_last": last}


@pytest.mark.parametrize("stock, fastpipe, status", [
    # fastpipe within noise of stock: the tolerance is the larger of the reps' range and a quarter of
    # stock's drop (2.3 -> 1.0: 0.325)
    ([_run(2.3, 1.0), _run(2.3, 1.1)], [_run(2.3, 1.25), _run(2.3, 1.2)], "as stock"),
    # fastpipe's loss fell much less than stock's: its batches do not teach what stock's teach
    ([_run(2.3, 1.0), _run(2.3, 1.05)], [_run(2.3, 2.1), _run(2.3, 2.2)], "FAILED"),
    # much better than stock is as suspicious as worse: the two must agree
    ([_run(2.3, 1.5), _run(2.3, 1.55)], [_run(2.3, 0.2), _run(2.3, 0.25)], "FAILED"),
    # noisy repetitions (a wide range between augmentation seeds) widen the tolerance
    ([_run(2.3, 0.6), _run(2.3, 1.6)], [_run(2.3, 1.9), _run(2.3, 1.8)], "as stock"),
    # stock did not learn either: the case says nothing about fastpipe
    ([_run(2.5, 2.33), _run(2.5, 2.4)], [_run(2.5, 2.41), _run(2.5, 2.45)], "inconclusive"),
    # a net that learnt within its first quarter of steps: its start is chance (ln 10), not its first loss
    ([_run(1.9, 1.6), _run(1.9, 1.65)], [_run(1.85, 1.6), _run(1.9, 1.7)], "as stock"),
    # stock fell, but by less than the noise: a loader that did not train would pass too
    ([_run(2.4, 0.9), _run(2.4, 2.3)], [_run(2.4, 1.0), _run(2.4, 1.1)], "inconclusive"),
])
def test_training_check_compares_fastpipe_with_stock_within_noise(stock, fastpipe, status):
    check = train.training_check({"stock": stock, "fastpipe": fastpipe}, quick=False)
    assert check["status"] == status, check
    assert train.training_check({"stock": stock, "fastpipe": fastpipe}, quick=True) == {"status": None}


def test_the_check_fails_a_loader_whose_labels_do_not_match_its_images(tmp_path, monkeypatch):
    """The check end to end on a small case that learns: fastpipe's batches with their labels shuffled
    (the images no longer teach their class) must fail it, the real ones pass it."""
    paths = train.ensure_data(str(tmp_path), "t", 512, 16)
    o = {"device": torch.device("cpu"), "gpu": False, "quick": False, "steps": 40, "warmup": 2, "width": 0.125,
         "workers": 0, "seed": 0, "lr": None}

    def case():
        return {"model": "resnet", "dataset": "t", "image_size": 16, "batch": 32, "records": 512, "steps": 40,
                "paths": paths, "runs": {"stock": [], "fastpipe": []}}

    real = train.FEEDS["fastpipe"]
    monkeypatch.delitem(train.FEEDS, "synthetic")  # the check compares these two only

    def shuffled_labels(paths, o, batch):
        g = torch.Generator().manual_seed(1)
        for x, y in real(paths, o, batch):
            yield x, y[torch.randperm(len(y), generator=g)]

    results = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny net: on a busy machine torch's spinning intra-op threads slowed it 10x
    try:
        for name, feed in (("real", real), ("shuffled", shuffled_labels)):
            monkeypatch.setitem(train.FEEDS, "fastpipe", feed)
            c = case()
            for rep in range(2):
                train.run_rep(c, o, rep)
            assert [r["aug_seed"] for r in c["runs"]["stock"]] == [0, 1000]  # a seed of its own per repetition
            results[name] = train.training_check(c["runs"], quick=False)
    finally:
        torch.set_num_threads(threads)
    assert results["real"]["status"] == "as stock", results
    assert results["shuffled"]["status"] == "FAILED", results
