"""The images suite: its corpus, its page-cache control, and a small --quick run end to end (no speeds)."""

import glob
import importlib.util
import json
import os
import re
import shutil

import numpy as np
import pytest

from fastpipe.bench import cli
from fastpipe.bench import image_baselines as ib
from fastpipe.bench import image_corpus, image_measure
from fastpipe.bench import images

HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None
HAS_FINCORE = shutil.which("fincore") is not None


class _Out:
    """The part of the Report that ensure_corpus uses."""

    show_progress = False

    def log(self, *parts):
        pass

    def progress(self, iterable=None, **kw):
        from fastpipe.bench.common import progress_bar

        return progress_bar(iterable, enabled=False, **kw)


def test_images_are_deterministic_and_imagenet_like():
    painter = image_corpus._Painter(image_corpus.GRAIN_SIGMA, seed=3)
    shapes = [image_corpus.image_shape(i, np.random.default_rng([3, i])) for i in range(40)]
    assert shapes[10] == (1600, 1200) and shapes[30] == (3000, 2000)  # every 20th is large
    assert sum(image_corpus.size_group(w, h) in ("1600x1200", "3000x2000") for w, h in shapes) == 2
    i = next(i for i, s in enumerate(shapes) if s == (500, 375))
    data, w, h = painter.encode(i, seed=3)
    assert (w, h) == (500, 375) and data[:2] == b"\xff\xd8"
    assert painter.encode(i, seed=3)[0] == data  # a pure function of (seed, index)
    assert 60_000 < len(data) < 150_000, len(data)  # ImageNet-like file size for q90 4:2:0 at 500x375


def test_corpus_is_made_once_and_reused(tmp_path):
    c = image_corpus.corpus_paths(str(tmp_path), 12, 1, image_corpus.GRAIN_SIGMA)
    facts = image_corpus.ensure_corpus(c, 12, 1, image_corpus.GRAIN_SIGMA, 2, _Out())
    files = sorted(glob.glob(os.path.join(c.tree, "class_*", "*.jpg")))
    assert len(files) == 12 and len(os.listdir(c.tree)) == images.CLASSES
    assert facts["count"] == 12 and facts["groups"]["1600x1200"]["count"] == 1
    assert 2.0 < facts["bpp"] < 6.0 and facts["packed_mb"] == pytest.approx(facts["total_mb"], rel=0.01)
    stamps = [os.stat(f).st_mtime_ns for f in files]
    again = image_corpus.ensure_corpus(c, 12, 1, image_corpus.GRAIN_SIGMA, 2, _Out())
    assert [os.stat(f).st_mtime_ns for f in files] == stamps  # reused, not rewritten
    assert again["count"] == 12
    os.remove(c.facts_path)  # no marker: an unfinished corpus is made again
    image_corpus.ensure_corpus(c, 12, 1, image_corpus.GRAIN_SIGMA, 2, _Out())
    assert os.path.exists(c.facts_path)


@pytest.mark.skipif(not HAS_FINCORE, reason="needs util-linux fincore")
def test_png_and_mixed_corpora_hold_the_same_images_in_their_formats(tmp_path):
    import io

    from PIL import Image

    import fastpipe

    def pil_rgb_array(data):
        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(im.convert("RGB"))

    trees = {}
    for kind in ("png", "mixed"):
        c = image_corpus.corpus_paths(str(tmp_path), 40, 1, image_corpus.GRAIN_SIGMA, kind)
        facts = image_corpus.ensure_corpus(c, 40, 1, image_corpus.GRAIN_SIGMA, 2, _Out(), kind)
        assert facts["kind"] == kind and facts["count"] == 40
        trees[kind] = fastpipe.ImageFolder(c.tree, cache_dir="off")
        assert not trees[kind].bad
    assert facts["formats"] == {"JPEG": 36, "PNG": 2, "WEBP": 2}
    assert trees["mixed"].image_formats.count("WebP") == 2 and set(trees["png"].image_formats) == {"PNG"}
    # The same picture in every corpus: PNG losslessly the pixels the JPEG was encoded from.
    i = next(i for i, f in enumerate(trees["mixed"].image_formats) if f == "PNG")
    png_path, mixed_path = trees["png"].samples[i][0], trees["mixed"].samples[i][0]
    assert open(png_path, "rb").read() == open(mixed_path, "rb").read()
    painter = image_corpus._Painter(image_corpus.GRAIN_SIGMA, seed=1)
    jpeg, _, _ = painter.encode(int(os.path.basename(png_path)[4:9]), seed=1)  # img_NNNNN.png
    assert np.abs(pil_rgb_array(jpeg).astype(int) - pil_rgb_array(open(png_path, "rb").read())).mean() < 8


def test_evict_and_warm_move_files_out_of_and_into_the_page_cache(tmp_path):
    paths = []
    for i in range(3):
        p = tmp_path / f"f{i}.bin"
        p.write_bytes(os.urandom(1 << 20))
        paths.append(str(p))
    os.sync()
    image_measure.warm(paths)
    assert image_measure.cached_fraction(paths) > 0.95
    image_measure.evict(paths)
    if images.bc.filesystem_of(str(tmp_path)).get("fstype") in ("tmpfs", "ramfs"):
        pytest.skip("a RAM filesystem keeps its files in memory")
    assert image_measure.cached_fraction(paths) < 0.05


def test_a_missing_peer_is_named_not_imported():
    assert ib.peer_missing("numpy") is None
    why = ib.peer_missing("fastpipe_no_such_peer.sub")
    assert "fastpipe_no_such_peer.sub is not installed" in why and "bench-peers" in why


@pytest.mark.timeout(120)
@pytest.mark.skipif(not HAS_TORCHVISION, reason="the DataLoader baselines need torchvision")
def test_quick_run_reports_every_row(tmp_path, monkeypatch):
    # The peers are reported as missing (whether or not they are installed) to test the skip path and
    # keep the test short; the quick run measures fastpipe and the two DataLoader rows in 3 processes.
    real = ib.peer_missing
    monkeypatch.setattr(ib, "peer_missing",
                        lambda m: "pretend: not installed" if m in ("nvidia.dali", "ffcv") else real(m))
    out = tmp_path / "res" / "images.json"
    rc = cli.main(["images", "--quick", "--images", "40", "--batch-size", "8", "--sizes", "160", "--corpora", "jpeg",
                   "--loaders", "fastpipe_folder,fastpipe_packed,dl_pil,dali_cpu,ffcv",
                   "--data-dir", str(tmp_path / "data"), "--out", str(out), "--no-progress"],
                  prog="fastpipe-bench")
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["suite"] == "images" and doc["complete"] and doc["options"]["quick"]
    assert doc["results"]["settings"]["corpora"] == ["jpeg"] and list(doc["results"]["corpora"]) == ["jpeg"]
    res = doc["results"]["corpora"]["jpeg"]
    assert res["settings"]["threads"] == images.usable_cpus() and res["settings"]["reps"] == 1
    assert res["corpus"]["count"] == 40 and os.path.isdir(tmp_path / "data" / "quick")
    assert res["skipped"] == {"dali_cpu": "pretend: not installed", "ffcv": "pretend: not installed"}
    cold_possible = HAS_FINCORE and doc["machine"]["data_dir_filesystem"].get("fstype") not in ("tmpfs", "ramfs")
    for state in ("warm", "cold"):
        rows = res["rows"][f"160_{state}"]
        assert list(rows) == ["fastpipe_folder", "fastpipe_packed", "dl_pil", "dali_cpu", "ffcv"]
        assert rows["dali_cpu"] == {"skipped": "pretend: not installed"}
        for key in ("fastpipe_folder", "fastpipe_packed", "dl_pil"):
            r = rows[key]
            assert "error" not in r, (state, key, r)
            assert r["images_per_s"] > 0 and r["cpu_s_per_1000"] > 0, (state, key, r)
            assert 100 < r["peak_pss_mib"] <= r["peak_rss_mib"] < 64 * 1024, (state, key, r)
            if cold_possible:
                assert (r["cached_at_start"] < 0.05) if state == "cold" else (r["cached_at_start"] > 0.95)
        assert rows["dl_pil"]["x_vs_baseline"] == pytest.approx(1.0)
    for key in ("fastpipe_folder", "fastpipe_packed", "dl_pil"):
        (run,) = res["runs"][key]
        entry = run["sizes"]["160"]
        assert set(entry["passes"]) == {"warm", "cold"} and "error" not in entry
        assert -1.0 < entry["pixels"]["mean"] < 1.0 and 0.5 < entry["pixels"]["std"] < 2.0, entry["pixels"]
        assert 0 <= entry["labels"][0] <= entry["labels"][1] < images.CLASSES
        for p in entry["passes"].values():
            assert p["images"] == 40 // 8 * 8 and p["batches"] == 5
            # DataLoader's work happens in its worker processes: their CPU time must be counted.
            assert (p["cpu_children_s"] > 0) if key == "dl_pil" else (p["cpu_children_s"] < 0.05), (key, p)
    lines = doc["results"]["headline"]
    assert any(line.startswith("fastpipe vs DataLoader + v2 (PIL), jpeg, 160x160 warm") for line in lines)
    assert any("DALI CPU" in line and "skipped (pretend: not installed)" in line for line in lines)
    md = open(doc["files"]["markdown"]).read()
    assert "jpeg corpus, 160x160, cold page cache" in md and "skipped: pretend: not installed" in md
    assert "Corpus (jpeg): 40 images (40 JPEG) in 10 classes" in md


@pytest.mark.timeout(120)
@pytest.mark.skipif(not HAS_TORCHVISION, reason="the DataLoader baselines need torchvision")
def test_quick_run_reports_the_recipe_rows_against_their_own_baseline(tmp_path):
    """The TA recipe rows (image_rows.py), bilinear and the references' bicubic, run on the JPEG corpus only,
    each compared with DataLoader + v2 running the same recipe, and the headline says what they cost fastpipe."""
    out = tmp_path / "res" / "images.json"
    rc = cli.main(["images", "--quick", "--images", "40", "--batch-size", "8", "--sizes", "160", "--cache", "warm",
                   "--corpora", "jpeg,png", "--loaders", "fastpipe_folder,fastpipe_recipe,dl_pil_recipe,"
                   "fastpipe_recipe_bicubic,dl_pil_recipe_bicubic",
                   "--data-dir", str(tmp_path / "data"), "--out", str(out), "--no-progress"], prog="fastpipe-bench")
    assert rc == 0
    doc = json.loads(out.read_text())
    jpeg, png = doc["results"]["corpora"]["jpeg"], doc["results"]["corpora"]["png"]
    assert png["skipped"] == {key: "the recipe rows run on the JPEG corpus" for key in
                              ("fastpipe_recipe", "dl_pil_recipe", "fastpipe_recipe_bicubic", "dl_pil_recipe_bicubic")}
    rows = jpeg["rows"]["160_warm"]
    assert rows["fastpipe_folder"]["x_vs_baseline"] is None  # the plain row has no recipe baseline here
    for ours, theirs in (("fastpipe_recipe", "dl_pil_recipe"), ("fastpipe_recipe_bicubic", "dl_pil_recipe_bicubic")):
        # Against the DataLoader row of the same recipe (one repetition: its ratio is the rates' ratio).
        assert rows[ours]["x_vs_baseline"] == pytest.approx(rows[ours]["images_per_s"] / rows[theirs]["images_per_s"])
    entry = jpeg["runs"]["fastpipe_recipe"][0]["sizes"]["160"]
    assert -1.0 < entry["pixels"]["mean"] < 1.0 and 0.5 < entry["pixels"]["std"] < 2.0, entry["pixels"]
    line = next(x for x in doc["results"]["headline"] if "TA recipe," in x)
    assert "fastpipe vs DataLoader + v2 (PIL), TA recipe, jpeg, 160x160 warm" in line
    assert "the augmentations cost" in line and "fastpipe ImageFolder" in line
    line = next(x for x in doc["results"]["headline"] if "TA recipe bicubic" in x)
    assert "fastpipe vs DataLoader + v2 (PIL), TA recipe bicubic, jpeg, 160x160 warm" in line
    assert "the bicubic crop and augmentations cost" in line


def test_the_budget_sizes_the_corpus_and_never_runs_under_two_repetitions(tmp_path):
    """The default run's corpus size comes from its budget, and its repetitions from the first one's time:
    a budget too small for more still gives two (a median and a range), says so, and shows the range."""
    assert images.budget_images(8) == 1000 and images.budget_images(0.5) == images.BUDGET_MIN_IMAGES
    assert images.budget_images(1000) == images.IMAGES
    loaders = "fastpipe_folder,dl_pil" if HAS_TORCHVISION else "fastpipe_folder,fastpipe_packed"
    out = tmp_path / "res" / "images.json"
    rc = cli.main(["images", "--budget-minutes", "0.01", "--images", "24", "--batch-size", "8", "--sizes", "32",
                   "--cache", "warm", "--corpora", "jpeg", "--loaders", loaders,
                   "--data-dir", str(tmp_path / "data"), "--out", str(out), "--no-progress"], prog="fastpipe-bench")
    assert rc == 0
    doc = json.loads(out.read_text())
    settings = doc["results"]["settings"]
    assert settings["reps"] == images.MIN_REPS == 2 and settings["budget_minutes"] == 0.01
    res = doc["results"]["corpora"]["jpeg"]
    assert [len(v) for v in res["runs"].values()] == [2, 2]
    md = open(doc["files"]["markdown"]).read()
    assert "time budget 0.01 min" in md and "over budget" in md
    assert res["rows"]["32_warm"]["fastpipe_folder"]["reps"] == 2
    if HAS_TORCHVISION:  # the headline's ratio with its range over the two repetitions
        (line,) = doc["results"]["headline"]
        assert re.search(r"ImageFolder \d+\.\d\dx \(\d+\.\d\d-\d+\.\d\d\)", line), line
        assert "medians of 2 reps" in line
