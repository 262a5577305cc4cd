"""The remote suite (fastpipe/bench/remote.py) with this repository's data and results folders:
`python benchmarks/webdataset_remote.py [--rounds N] [--rtt-ms MS] ...` is
`python -m fastpipe.bench remote --data-dir benchmarks/data --out-dir benchmarks/results ...`. Its peers
need `make bench-remote-peers` and `.venv-peers/bin/python`."""

import sys

from fastpipe.bench.cli import main

if __name__ == "__main__":
    sys.exit(main(["remote", "--data-dir", "benchmarks/data", "--out-dir", "benchmarks/results", *sys.argv[1:]],
                  prog="benchmarks/webdataset_remote.py"))
