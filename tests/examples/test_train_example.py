"""examples/train.py as users run it: one process, and under torchrun with 2 CPU processes (DDP over gloo).

The ranks' batches are checked against the records they logged (each record carries its own index), never
against the Loader's bookkeeping: disjoint shards that cover each epoch, equal batch counts, and a run
stopped, saved and resumed that sees the same batches and ends with the same weights as one run straight
through, and its checkpoint resumed by one process.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

# Each torchrun start imports torch twice on 2 cores (~10 s); the module runs four of them.
pytestmark = [pytest.mark.timeout(420), pytest.mark.torch_build]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train.py"
WORLD, BATCH, EPOCHS = 2, 8, 2
N = 192  # = 12 full batches per rank: the default "pad" sharding pads nothing, drop_last drops nothing
STEPS = N // (WORLD * BATCH)
STOP = 5  # run B stops after this many steps of epoch 0; run C resumes from there


def run(args, world=WORLD, timeout=120):
    """Runs the example (under torchrun when world > 1); its stdout. Fails with its output otherwise."""
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}"]
    cmd = [*(launch if world > 1 else [sys.executable]), str(SCRIPT), "--batch-size", str(BATCH),
           "--workers", "2", "--print-every", "4", *map(str, args)]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    # PYTHONFAULTHANDLER: a rank that aborts prints every thread's Python stack, so that the failure says
    # where each one was (gloo's exit race, examples/train.py's end, shows as a main thread past its last frame).
    env.update(OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    # Its own session, so that a hang kills torchrun's workers too, not only torchrun.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} hung for {timeout} s\nstdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}",
                    pytrace=False)
    assert proc.returncode == 0, (f"{' '.join(cmd)}: exit {proc.returncode}\n"
                                  f"stdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}")
    print(out)
    return out


def steps_logged(prefix, rank):
    with open(f"{prefix}.rank{rank}") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """Run A: two epochs straight through on 2 ranks; (data dir, work dir, per-rank logged steps)."""
    work = tmp_path_factory.mktemp("train_example")
    data = work / "data"
    run(["--data", data, "--num-samples", N, "--epochs", EPOCHS, "--log-indices", work / "A", "--save", work / "A.pt"])
    return data, work, [steps_logged(work / "A", r) for r in range(WORLD)]


def test_single_process_smoke(tmp_path):
    out = run(["--data", tmp_path / "data", "--num-samples", 64, "--epochs", 1, "--steps", 3], world=1)
    assert "epoch 0: 3 steps" in out
    image, label, index = (np.load(tmp_path / "data" / f"{k}.npy") for k in ("image", "label", "index"))
    assert image.dtype == np.uint8 and image.shape == (64, 3, 32, 32)
    assert label.dtype == np.int64 and label.shape == (64,) and 0 <= label.min() and label.max() < 10
    assert np.array_equal(index, np.arange(64))


def test_ranks_see_disjoint_records_covering_each_epoch(straight):
    data, _, logs = straight
    assert np.array_equal(np.load(data / "index.npy"), np.arange(N)), "the logged indices must be record numbers"
    counts = [len(steps) for steps in logs]
    print(f"batches per rank: {counts} (expected {EPOCHS * STEPS})")
    assert counts == [EPOCHS * STEPS] * WORLD
    orders = []
    for epoch in range(EPOCHS):
        shards = [[i for s in steps if s["epoch"] == epoch for i in s["index"]] for steps in logs]
        assert all(len(s) == STEPS * BATCH for s in shards), f"epoch {epoch}: {[len(s) for s in shards]} records"
        assert not set(shards[0]) & set(shards[1]), f"epoch {epoch}: ranks share {set(shards[0]) & set(shards[1])}"
        seen = sorted(shards[0] + shards[1])
        assert seen == list(range(N)), f"epoch {epoch}: missing {set(range(N)) - set(seen)}"
        orders.append(shards[0])
    assert orders[0] != orders[1], "each epoch must be shuffled anew"


@pytest.fixture(scope="module")
def stopped(straight):
    """Run B: the first STOP steps of epoch 0 on 2 ranks, saved; (its checkpoint, per-rank logged steps)."""
    data, work, _ = straight
    run(["--data", data, "--save", work / "B.pt", "--epochs", 1, "--steps", STOP, "--log-indices", work / "B"])
    return work / "B.pt", [steps_logged(work / "B", r) for r in range(WORLD)]


def test_resume_continues_exactly(straight, stopped):
    data, work, logs = straight
    ckpt, stops = stopped
    run(["--data", data, "--save", work / "C.pt", "--epochs", EPOCHS, "--resume", ckpt, "--log-indices", work / "C"])
    for r in range(WORLD):
        stopped_steps, resumed = stops[r], steps_logged(work / "C", r)
        assert len(stopped_steps) == STOP and len(resumed) == EPOCHS * STEPS - STOP
        got = [(s["epoch"], s["index"]) for s in stopped_steps + resumed]
        assert got == [(s["epoch"], s["index"]) for s in logs[r]], f"rank {r}: the resumed run saw other batches"
        # Same weights, same batches, a sum over 2 ranks and one thread: every step's loss is the same float.
        assert [s["loss"] for s in stopped_steps + resumed] == [s["loss"] for s in logs[r]], f"rank {r}: losses differ"
    a, c = torch.load(work / "A.pt"), torch.load(work / "C.pt")
    assert c["loader"] == a["loader"], "the resumed loader must end where the straight one did"
    diff = max((a["model"][k].double() - c["model"][k].double()).abs().max().item() for k in a["model"])
    print(f"max |A - C| over the model's state: {diff}")
    assert diff == 0.0, "resuming must reproduce the straight run's weights bit for bit"


def test_a_checkpoint_of_2_ranks_resumes_on_one(straight, stopped):
    """The checkpoint holds rank 0's loader state; one process resumes from it the rest of epoch 0: the
    records the 2 ranks had not read, each once."""
    data, work, _ = straight
    ckpt, stops = stopped
    run(["--data", data, "--epochs", 1, "--resume", ckpt, "--log-indices", work / "D"], world=1)
    read = [i for steps in stops for s in steps for i in s["index"]]
    rest = [i for s in steps_logged(work / "D", 0) for i in s["index"]]
    assert len(read) == WORLD * STOP * BATCH and len(rest) == N - len(read)
    assert sorted(read + rest) == list(range(N)), "the resumed rank must read exactly the records not yet read"
