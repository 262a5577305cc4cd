"""python -m fastpipe.bench: each suite's quick mode end to end in a subprocess, and the CLI's own paths."""

import glob
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import fastpipe.nn
from fastpipe.bench import BUDGET_MINUTES, cli

REPO = pathlib.Path(__file__).resolve().parents[2]
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None
COMMON_ROWS = ["fastpipe", "fastpipe_1t", "fastpipe_0t", "dl_sample_w0", "dl_sample_w2", "dl_batch_w0", "dl_batch_w2"]
IMAGE_ROWS = COMMON_ROWS + ["index_select", "mm_index", "mm_sorted", "bound"]
TOKEN_ROWS = COMMON_ROWS + ["mm_index", "mm_sorted", "mm_nanogpt", "bound_raw", "bound"]
MACHINE_FACTS = ("hostname", "date", "cpu_model", "usable_cpus", "mem_total_bytes", "torch", "fastpipe",
                 "fastpipe_build_info", "gpus", "loadavg_start", "loadavg_end")


def bench(*args, cwd, timeout=240, script=None):
    """Runs the CLI (or a benchmarks/ script) in a fresh interpreter; fails with its output unless it
    exits 0. The conv engine cache is off so that a test run leaves the user's cache alone."""
    cmd = [sys.executable, str(REPO / "benchmarks" / script)] if script else [sys.executable, "-m", "fastpipe.bench"]
    env = {**os.environ, "FASTPIPE_CONV_CACHE": "off", "PYTHONFAULTHANDLER": "1"}
    try:
        p = subprocess.run(cmd + list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd + list(args))} ran over {timeout} s\n{e.stdout}\n{e.stderr}", pytrace=False)
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout[-4000:]}\nstderr:\n{p.stderr[-4000:]}"
    return p


def check_files(doc, suite, plotted=True):
    """The report's files: JSON (complete, with machine facts), markdown, and a PNG per plot (a suite
    that plots: where matplotlib is installed)."""
    assert doc["suite"] == suite and doc["complete"] is True
    for key in MACHINE_FACTS:
        assert key in doc["machine"], key
    md = open(doc["files"]["markdown"]).read()
    assert md.startswith(f"# fastpipe bench: {suite}\n") and doc["machine"]["cpu_model"] in md
    plots = doc["files"]["plots"]
    if HAS_MATPLOTLIB and plotted:
        assert plots, "matplotlib is installed but no plot was written"
        for path in plots:
            with open(path, "rb") as f:
                assert f.read(8) == b"\x89PNG\r\n\x1a\n", path
            assert f"]({os.path.basename(path)})" in md
    else:
        assert plots == []
    return md


@pytest.fixture(scope="module")
def make_bench_run(tmp_path_factory):
    """What `make bench` runs (the loader, train and images suites), quick, as a new user runs it: from a
    directory outside the checkout, with relative data and results folders (a relative ImageFolder root
    once failed the train suite there)."""
    d = tmp_path_factory.mktemp("bench")
    assert REPO not in d.parents
    p = bench("all", "--suites", "loader,train,images", "--quick", "--out-dir", "res", "--data-dir", "data",
              "--no-progress", cwd=d, timeout=900)
    docs = {}
    for suite in ("loader", "train", "images"):
        (path,) = glob.glob(str(d / "res" / f"{suite}_*.json"))
        docs[suite] = json.loads(open(path).read())
    return docs, p.stdout, d


@pytest.fixture(scope="module")
def loader_run(make_bench_run):
    docs, stdout, d = make_bench_run
    return docs["loader"], stdout, d


@pytest.mark.timeout(900)
def test_make_bench_suites_run_from_outside_the_checkout(make_bench_run):
    docs, stdout, d = make_bench_run
    assert "FAILED" not in stdout
    for suite, doc in docs.items():
        check_files(doc, suite)
        assert doc["options"]["data_dir"] == "data" and os.path.isdir(d / "data" / "quick"), suite
    images = docs["images"]["results"]
    assert list(images["corpora"]) == ["jpeg", "png", "mixed"]
    for kind, corpus in images["corpora"].items():
        assert corpus["corpus"]["kind"] == kind
        for state in ("warm", "cold"):
            row = corpus["rows"][f"224_{state}"]["fastpipe_folder"]
            assert "error" not in row and row["images_per_s"] > 0, (kind, state, row)
        assert corpus["skipped"].get("ffcv", "").startswith("FFCV's .beton") == (kind != "jpeg")


@pytest.mark.timeout(900)
def test_loader_quick_writes_every_row_and_check(loader_run):
    doc, stdout, d = loader_run
    md = check_files(doc, "loader")
    assert doc["options"]["quick"] is True
    assert os.path.isdir(d / "data" / "quick")  # quick data is kept apart from the full-size data
    results = doc["results"]
    assert set(results["datasets"]) == {"cifar", "imagenet", "tokens", "direct"}
    for name, rows in (("cifar", IMAGE_ROWS), ("imagenet", IMAGE_ROWS), ("tokens", TOKEN_ROWS)):
        ds = results["datasets"][name]
        assert list(ds["loaders"]) == rows, name
        timed = min(30, ds["batches_per_epoch"] - 3)  # quick: 30 batches a pass after 3 untimed ones
        for key, row in ds["loaders"].items():
            assert row["error"] is None, (name, key, row["error"])
            assert row["samples_per_s"] > 0 and row["timed_batches_per_pass"] == timed, (name, key)
            assert row["overlap_added_pct"] is not None, (name, key)
            # issue 21: fastpipe's rows also run the loop with a busy step, and say how long the training
            # thread waited for a core
            assert ("busy_added_pct" in row) == key.startswith("fastpipe"), (name, key)
            # and a step that reads the batch with torch ops, with the gathers that run on the training thread
            assert ("torch_added_pct" in row) == (key.startswith("fastpipe") or key in ("index_select", "bound")), (
                name, key)
            assert not key.startswith("fastpipe") or min(row["busy_run_delay_ms_per_step"],
                                                         row["overlap_run_delay_ms_per_step"]) >= 0, (name, key)
        check = ds["fastpipe"]["order_check"]
        assert check["is_permutation"] and not check["byte_exact_mismatches"], check
        assert ds["order"].startswith("fastpipe's")
        assert "| fastpipe.Loader" in md and "loader alone" in md
    direct = results["datasets"]["direct"]["fastpipe"]
    assert set(direct) == {"shuffle", "sequential"}
    summary = results["summary"]
    assert len(summary) == 15 and all(s["status"] in ("PASS", "FAIL", "SKIP", "INVALID") for s in summary)
    assert "Targets (issue 2" in stdout and "| target | median | range | best pass | status |" in md
    if HAS_MATPLOTLIB:
        assert sorted(os.path.basename(p).split("_", 3)[-1] for p in doc["files"]["plots"]) == [
            "cifar_alone.png", "direct.png", "imagenet_alone.png", "tokens_alone.png"]


@pytest.mark.skipif(not (shutil.which("nginx") or os.path.exists("/usr/sbin/nginx"))
                    or importlib.util.find_spec("moto") is None, reason="needs nginx and moto (`make setup`)")
@pytest.mark.timeout(600)
def test_remote_quick_reports_every_row(tmp_path):
    """The remote suite end to end (quick, 20 ms only): fastpipe's rows over each server, the local row,
    and every peer either measured or named with the reason it did not run."""
    bench("remote", "--quick", "--no-direct", "--out-dir", "res", "--data-dir", "data", "--no-progress", cwd=tmp_path,
          timeout=540)
    (path,) = glob.glob(str(tmp_path / "res" / "remote_*.json"))
    doc = json.loads(open(path).read())
    md = check_files(doc, "remote", plotted=False)
    results = doc["results"]
    rates, fetched = results["rates"], results["fetched"]
    for store in ("http", "s3", "s3 via nginx"):
        rows = {kind: f"{store} 20 ms: fastpipe {kind}" for kind in ("first time", "cold", "warm")}
        rows["stream"] = f"{store} 20 ms: fastpipe stream (cache_limit shards/2), 2nd epoch"
        for kind, key in rows.items():
            assert min(rates[key]) > 0 and min(results["rates_after_first_batch"][key]) > 0, key
            assert results["first_batch"][key], key
            share = max(fetched[key]) / results["shard_bytes"]
            # Cold: every shard once; warm: nothing; streaming through half the cache, its second epoch:
            # every block once (the images' bytes, at most the shards') but its first window (fetched in
            # the first epoch), and the next epoch's first window ahead of it (quick: 4 shards of about 60
            # images, a window of one).
            want = {"warm": (0, 0), "stream": (0.9, 1.0 + 1 / 4 + 0.02)}.get(kind, (1.0, 1.02))
            assert want[0] <= share <= want[1], (key, share)
        assert f"| {store} 20 ms: fastpipe cold" in md
    # With a core left to the network's side: cold (every shard once) and warm, over http.
    spare = {k.split(": ")[1]: k for k in rates if k.startswith("http 20 ms, ")}
    if len(os.sched_getaffinity(0)) > 1:
        assert sorted(spare) == ["fastpipe cold", "fastpipe warm"], spare
        assert 1.0 <= max(fetched[spare["fastpipe cold"]]) / results["shard_bytes"] <= 1.02
        assert max(fetched[spare["fastpipe warm"]]) == 0 and f"| {spare['fastpipe cold']}" in md
    assert min(rates["local: fastpipe"]) > 0
    for peer in ("litdata", "Mosaic streaming (MDS)", "s3torchconnector (tar shards)", "webdataset + WebLoader"):
        key = f"s3 20 ms: {peer}"
        assert (key in rates) != (key in results["not_run"]), key
        assert key in rates or results["not_run"][key].startswith("not run: "), key
    for key, why in results["not_run"].items():
        assert f"- {key}: {why}" in md, key  # the tables say why a row was not run, not only the JSON


def test_conv_quick_runs_a_few_rows_of_every_part(tmp_path):
    out = tmp_path / "conv.json"
    bench("conv", "--quick", "--out", str(out), "--no-progress", cwd=tmp_path, timeout=300)
    doc = json.loads(out.read_text())
    md = check_files(doc, "conv")
    assert doc["files"]["markdown"] == str(tmp_path / "conv.md")
    layers = doc["results"]["layers"]
    assert layers["complete"] and not layers["options"]["compile"]
    assert len(layers["rows"]) == 4 * 2 * 2  # a row per family, both layouts, fwd and fwdbwd
    for r in layers["rows"]:
        assert r["speedup"] > 0 and r["engines"], r
    assert {s["family"] for s in layers["summary"]} >= {"all", "resnet50", "mobilenetv2", "convnext", "efficientnet"}
    overhead = doc["results"]["overhead"]["rows"]
    assert len(overhead) == 3 and all(set(r["overhead_us"]) == {"op", "functional", "module"} for r in overhead)
    models = doc["results"]["models"]
    if HAS_TORCHVISION:
        (row,) = models["rows"]
        assert row["model"] == "resnet18" and row["fused_sites"] > 0
        assert "| resnet18 b1 nchw |" in md
    else:
        assert models == {"skipped": "torchvision is not installed"}
    assert "**layers: cpu fp32 b2 nchw fwd**" in md and "**overhead:" in md


@pytest.mark.skipif(not fastpipe.nn.conv_engines("cpu")[1:], reason="no CPU conv engine besides eager to force")
def test_conv_force_engines_times_every_engine_and_says_which_ran(tmp_path):
    """--force-engines: each row gets each engine's speedup forced and the engines that really ran (the
    validation figures of a new engine); in forward+backward rows the backward runs eager (the CPU has
    no backward engine of a forward engine's name)."""
    out = tmp_path / "conv.json"
    bench("conv", "--part", "layers", "--quick", "--force-engines", "--rows", "1x1 64>256", "--layout", "channels_last",
          "--out", str(out), "--no-progress", cwd=tmp_path, timeout=300)
    doc = json.loads(out.read_text())
    rows = {r["mode"]: r for r in doc["results"]["layers"]["rows"]}
    engines = fastpipe.nn.conv_engines("cpu")[1:]
    assert set(rows["fwd"]["forced"]) == set(rows["fwdbwd"]["forced"]) == set(engines)
    for name in engines:  # oneDNN computes this fp32 row
        assert rows["fwd"]["forced"][name]["speedup"] > 0 and rows["fwd"]["forced"][name]["ran"] == [name]
        assert rows["fwdbwd"]["forced"][name]["ran"] == ["backward:eager", name], rows["fwdbwd"]["forced"][name]
    assert "each engine forced" in open(doc["files"]["markdown"]).read()


def test_benchmarks_script_keeps_its_flags_and_defaults(tmp_path):
    """benchmarks/conv_overhead_bench.py: the conv suite's overhead part, 2 threads, old flags."""
    out = tmp_path / "o.json"
    bench("--calls", "50", "--rounds", "1", "--out", str(out), "--no-progress", cwd=tmp_path,
          script="conv_overhead_bench.py")
    doc = json.loads(out.read_text())
    assert list(doc["results"]) == ["overhead"] and doc["results"]["overhead"]["threads"] == 2
    assert doc["results"]["overhead"]["options"] == {"calls": 50, "rounds": 1}
    assert doc["options"]["out_dir"] == str(REPO / "benchmarks" / "results")


@pytest.mark.skipif(not HAS_TORCHVISION, reason="the torchvision row needs torchvision")
def test_gpu_jpeg_bench_smoke_reports_every_row(tmp_path):
    """benchmarks/gpu_jpeg_bench.py --smoke: its rows on the simulated device (torchvision's on the CPU), on
    the ImageNet-coded corpus, with what the device check brings back per row."""
    out = tmp_path / "jpeg.json"
    bench("--smoke", "--data-dir", str(tmp_path / "d"), "--out", str(out), cwd=tmp_path, script="gpu_jpeg_bench.py")
    doc = json.loads(out.read_text())
    assert set(doc["jpeg_variants"]) == {"4:2:0", "4:2:2", "4:4:4", "gray", "progressive"}, doc["jpeg_variants"]
    for row in ("host", "device", "torchvision"):
        r = doc[row]
        assert r["images_per_s"] > 0 and r["batch_gap_ms_p99"] >= r["batch_gap_ms_p50"] > 0 and r["cpu_cores"] > 0, r
    # Progressive files (and the large ones, shrunk more than 4x) decode on the host, the rest in planes.
    dev = doc["device"]
    assert dev["decoded_planar"] == dev["decoded_on_device"] > 0 and dev["decoded_on_host"] > 0, dev
    assert doc["host"]["decoded_on_device"] == 0


def test_gpu_loader_bench_smoke_reports_h2d_and_training(tmp_path):
    """benchmarks/gpu_loader_bench.py --smoke on the simulated device: the rows the device check reads."""
    out = tmp_path / "loader.json"
    bench("--smoke", "--out", str(out), cwd=tmp_path, script="gpu_loader_bench.py")
    doc = json.loads(out.read_text())
    h2d = doc["h2d_bytes_per_s"]
    assert h2d["fastpipe.Loader(device='cuda')"] > 0 and h2d["readers alone (the Loader's CPU batches)"] > 0, h2d
    assert set(doc["train"]) == {"DataLoader", "fastpipe"} and doc["ratios"]["fastpipe_over_dataloader_images_per_s"] > 0


def test_help_lists_the_suites(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"], prog="fastpipe-bench")
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "{loader,images,conv,train,soak,remote,all}" in text
    for name in ("loader", "images", "conv", "train", "soak", "remote", "all"):
        assert f"\n    {name} " in text, name


def test_suite_help_lists_common_and_own_options(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["loader", "--help"], prog="fastpipe-bench")
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: fastpipe-bench loader")
    for option in ("--quick", "--out-dir", "--out", "--tag", "--data-dir", "--no-progress", "--only", "--reps"):
        assert option in text, option


@pytest.mark.parametrize("argv", [["bogus"], ["loader", "--bogus"], ["all", "--suites", "loader,bogus"]])
def test_unknown_suite_or_option_is_an_argparse_error(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv, prog="fastpipe-bench")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: fastpipe-bench" in err and "error:" in err


def test_a_missing_suite_is_named_not_a_crash(monkeypatch, capsys):
    real = cli.load_suite
    monkeypatch.setattr(cli, "load_suite", lambda name: None if name == "train" else real(name))
    assert cli.main(["train", "--quick"], prog="fastpipe-bench") == 2
    assert "the train suite is not in this install (fastpipe/bench/train.py is missing)" in capsys.readouterr().err
    assert cli.main(["all", "--suites", "train"], prog="fastpipe-bench") == 0
    assert "train   skipped: the train suite is not in this install" in capsys.readouterr().out


def test_console_script_is_declared():
    tomllib = pytest.importorskip("tomllib")
    with open(REPO / "pyproject.toml", "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts["fastpipe-bench"] == "fastpipe.bench.cli:main"
    assert callable(cli.main)


def test_bench_extra_declares_the_harness_optional_packages():
    tomllib = pytest.importorskip("tomllib")
    with open(REPO / "pyproject.toml", "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    assert {"pillow", "tqdm", "matplotlib"} <= set(extras["bench"])


def test_all_shares_a_total_budget_and_passes_full(monkeypatch):
    """`all --budget-minutes T` shares T among the suites in proportion to their own defaults; --full and
    --quick reach every suite; the two exclude each other."""
    seen = {}

    def fake_run_suite(name, args):
        seen[name] = (args.budget_minutes, args.full, args.quick)
        return {"json": "x.json", "markdown": "x.md", "plots": [], "headline": []}

    monkeypatch.setattr(cli, "run_suite", fake_run_suite)
    assert cli.main(["all", "--suites", "loader,train,images", "--budget-minutes", "9"], prog="fastpipe-bench") == 0
    total = sum(BUDGET_MINUTES[s] for s in ("loader", "train", "images"))
    assert seen == {s: (pytest.approx(9 * BUDGET_MINUTES[s] / total), False, False) for s in ("loader", "train", "images")}
    seen.clear()
    assert cli.main(["all", "--suites", "train,conv", "--full"], prog="fastpipe-bench") == 0
    assert seen == {"train": (None, True, False), "conv": (None, True, False)}  # None: the suite's own default
    with pytest.raises(SystemExit) as e:
        cli.main(["all", "--quick", "--full"], prog="fastpipe-bench")
    assert e.value.code == 2
