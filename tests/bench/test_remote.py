"""The remote suite's bookkeeping of a peer that fails (fastpipe/bench/remote.py peer_failed): its rounds
measured before stand, with why it stopped; a peer that never ran is reported as not run."""

from fastpipe.bench.remote import METRICS, peer_failed


def _results(rows):
    return {m: {k: list(v) for k, v in rows.items()} for m in METRICS}


def test_a_peer_failing_after_a_round_keeps_it_and_says_why():
    first, second = "s3 20 ms: litdata, first epoch", "s3 20 ms: litdata, second epoch"
    results = _results({first: [91.0], second: [209.0], "local: fastpipe": [1000.0, 990.0]})
    skipped, stopped = {}, {}
    peer_failed(RuntimeError("Traceback ...\nChunkWaitTimeoutError: timed out"), [first, second], 3, results,
                skipped, stopped)
    assert skipped == {}
    assert stopped == {k: "measured in 1 of 3 rounds, then failed against this server: RuntimeError: "
                          "ChunkWaitTimeoutError: timed out" for k in (first, second)}
    assert results["rates"][first] == [91.0] and results["first_batch"][second] == [209.0]


def test_a_peer_failing_in_its_first_round_is_not_run_and_leaves_no_row():
    first, second = "s3 20 ms: litdata, first epoch", "s3 20 ms: litdata, second epoch"
    results = _results({first: [], second: [], "local: fastpipe": [1000.0]})
    skipped, stopped = {}, {}
    peer_failed(OSError("connection refused"), [first, second], 2, results, skipped, stopped)
    assert stopped == {}
    assert skipped == {k: "not run: failed against this server: OSError: connection refused" for k in (first, second)}
    for m in METRICS:
        assert set(results[m]) == {"local: fastpipe"}
