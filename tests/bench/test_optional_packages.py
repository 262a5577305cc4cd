"""The harness without its optional packages (issue 36): every suite runs, only the plots are skipped with a
note. Each test runs in a fresh interpreter where the package cannot be imported (``sys.modules[name] =
None`` makes ``import name`` raise ImportError, as when it is not installed)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

BLOCK = """
import sys
for name in {names!r}:
    sys.modules[name] = None  # `import name` (and any submodule) now raises ImportError
"""


def run_without(names, body, tmp_path, timeout=120):
    script = textwrap.dedent(BLOCK.format(names=list(names))) + textwrap.dedent(body)
    p = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"
    return p.stdout


@pytest.mark.timeout(120)
def test_images_suite_runs_without_matplotlib_and_notes_the_skipped_plots(tmp_path):
    """The images suite end to end, small: its corpus (which once needed matplotlib's sample photo), a case
    process, its tables, and the harness's plot path, which skips the PNGs with one note."""
    out = run_without(["matplotlib", "matplotlib.cbook", "matplotlib.figure"], """
        from fastpipe.bench import cli
        rc = cli.main(["images", "--images", "12", "--batch-size", "4", "--sizes", "32", "--cache", "warm",
                       "--corpora", "jpeg", "--loaders", "fastpipe_folder", "--reps", "1",
                       "--data-dir", "data", "--out", "res/images.json", "--no-progress"], prog="fastpipe-bench")
        assert "matplotlib" not in sys.modules or sys.modules["matplotlib"] is None
        print("rc", rc)
        """, tmp_path)
    assert "rc 0" in out
    assert out.count("matplotlib is not installed, so no PNG plots were written") == 1, out
    doc = json.loads((tmp_path / "res" / "images.json").read_text())
    assert doc["complete"] and doc["files"]["plots"] == []
    corpus = doc["results"]["corpora"]["jpeg"]
    assert corpus["corpus"]["count"] == 12 and "synthetic scenes" in corpus["corpus"]["source"]
    row = corpus["rows"]["32_warm"]["fastpipe_folder"]
    assert "error" not in row and row["images_per_s"] > 0, row
    md = (tmp_path / "res" / "images.md").read_text()
    assert "Corpus (jpeg): 12 images" in md and "![" not in md  # tables, no plot links


def test_images_suite_without_pillow_is_skipped_with_the_reason(tmp_path):
    """Pillow makes the corpus: without it the suite says so and the run goes on (exit 0)."""
    out = run_without(["PIL"], """
        from fastpipe.bench import cli
        rc = cli.main(["all", "--suites", "images", "--data-dir", "data", "--out-dir", "res", "--no-progress"],
                      prog="fastpipe-bench")
        print("rc", rc)
        """, tmp_path)
    assert "rc 0" in out and "images suite skipped: its corpus is made with Pillow" in out, out
