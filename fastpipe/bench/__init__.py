"""fastpipe's benchmark harness: ``python -m fastpipe.bench {loader,images,conv,train,soak,all}``
(or ``fastpipe-bench``).

Each suite runs fastpipe against stock PyTorch in one process (images: one per loader), prints tables, and writes
``<suite>_<tag or hostname>_<date>.json`` (results, options, machine facts), a ``.md`` of the printed
tables and ``_<plot>.png`` plots (with matplotlib) under ``--out-dir``. See benchmarks/README.md.

A suite is a module ``fastpipe.bench.<name>`` listed in ``SUITES`` with two functions:

``add_arguments(parser)``
    Adds the suite's own options to its ``argparse`` subparser. The CLI adds the common ones, which every
    suite reads from ``args``: ``quick`` (a smoke run that finishes in well under a minute on 2 cores:
    small data under ``data_dir/quick``, few repetitions), ``data_dir`` (where generated data lives),
    ``out_dir``, ``out``, ``tag`` and ``no_progress`` (the last four are the Report's business).
``run(args, out) -> dict``
    Runs the suite and returns its results, JSON-able (numpy scalars, NaN and tuples are fine). ``out`` is
    a ``fastpipe.bench.common.Report``: ``out.log(...)`` prints; ``out.heading``, ``out.note`` and
    ``out.table(headers, rows, title=)`` print and go into the markdown file; ``out.bars(name, title,
    {series: {label: value}}, xlabel)`` adds a PNG plot; ``out.progress(iterable or total=...)`` is a
    tqdm bar on stderr (off when stderr is no terminal or with ``--no-progress``);
    ``out.checkpoint(results)`` saves the JSON so far (for runs a time limit may cut short);
    ``out.facts`` is the machine facts dict, to which a suite may add. The CLI saves the returned dict;
    its optional ``"headline"`` (a list of one-line strings) is repeated at the end of ``all``.
    A suite reports a bad option with ``raise SystemExit("message")``.

Every suite also reads ``full`` (the publication run: full data sizes and repetitions) and
``budget_minutes`` (None: its ``BUDGET_MINUTES`` entry, if it has one); ``common.Budget`` turns a budget
into a number of repetitions.

``all`` runs the suites in the order of ``SUITES`` with their default options; a suite whose module
is absent from an install is skipped with a message.
"""

import importlib
import importlib.util

# name -> one line for --help; `all` runs them in this order.
SUITES = {
    "loader": "fastpipe.Loader against DataLoader variants, memmap indexing and the single-thread gather bound",
    "images": "JPEG training pipelines: fastpipe against DataLoader + torchvision (PIL, decode_jpeg), DALI CPU, FFCV",
    "conv": "fused convolutions against eager and torch.compile: layers, per-call overhead, whole models",
    "train": "end-to-end training steps: fastpipe against stock PyTorch and the synthetic-data limit",
    "soak": "a long run with resumes and held batches: memory, fds, threads and arena slots stay flat",
    "remote": "WebDataset shards from S3 and HTTP servers on 127.0.0.1: cold, warm, streaming, against peers",
}

# The default run's wall-clock budget of each suite that has one, in minutes (``--budget-minutes``; none with
# ``--full`` or ``--quick``): the suite measures its first repetition, and runs another while the slowest so far
# still fits (``common.Budget``). Sized
# so that `make bench` (loader, train, images) gives its headline in under 20 minutes on 2 cores,
# data generation included.
BUDGET_MINUTES = {"loader": 5.0, "train": 5.0, "images": 8.0}


def load_suite(name):
    """The suite's module, or None when this install does not have it."""
    if importlib.util.find_spec(f"{__name__}.{name}") is None:
        return None
    return importlib.import_module(f"{__name__}.{name}")
