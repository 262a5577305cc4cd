"""fastpipe.Loader under the trainers users switch it into: Lightning and Accelerate, 2 CPU processes (gloo).

Each run starts the way users start it: Lightning's ``Trainer(accelerator="cpu", devices=2, strategy="ddp")``
from a plain ``python script.py`` (Lightning starts the second process itself), Accelerate's
``accelerator.prepare(model, optimizer, loader)`` under ``torchrun`` (``accelerate launch --cpu`` starts one
process unless given an MPI hostfile; torchrun is how Accelerate runs several CPU processes without MPI).
The Loader is built inside the run, so its rank and world size come from the framework's process group.

Every record holds its own index: each rank logs the indices it trained on, per epoch, to a file, and this
process checks them against the sharding contract, never against the Loader's bookkeeping. 103 records on
2 ranks with shard_remainder="pad" (the default): 52 records (7 batches of 8, the last of 4) per rank and
epoch, every record at least once, exactly one twice; a second epoch in another order. A framework that
sharded the Loader again (as Lightning does to a DataLoader with a DistributedSampler) would halve that.

The runs also log what each framework does to a Loader (which calls reach it, whether it is replaced),
which README's "Distributed" paragraph states; the checks below keep those statements true.
"""

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# A run imports torch and the framework in both processes at once on 2 cores: ~15-25 s. The limits are
# for a loaded CI machine and a hang, not the expected time.
pytestmark = [pytest.mark.timeout(240), pytest.mark.torch_build]
RUN_TIMEOUT = 180

ROOT = Path(__file__).resolve().parents[2]
N, BATCH, WORLD, EPOCHS, SEED = 103, 8, 2, 2, 11
PER_RANK = math.ceil(N / WORLD)  # 52: "pad" repeats one record so that both ranks get as many
STEPS = math.ceil(PER_RANK / BATCH)  # 7, the last batch of 4


def needs(module):
    """Skips the test without ``module`` (found without importing it: importing Lightning costs ~5 s here)."""
    return pytest.mark.skipif(importlib.util.find_spec(module) is None,
                              reason=f"{module} is not installed (requirements/common.txt lists it)")


def write_data(directory):
    """idx: the record's own index; x: 4 floats from it (something for a model to train on)."""
    directory.mkdir()
    idx = np.arange(N, dtype=np.int64)
    np.save(directory / "idx.npy", idx)
    np.save(directory / "x.npy", (idx[:, None] * np.array([1, -1, 2, -2]) / N).astype(np.float32))
    return directory


def launch(cmd, cwd):
    """Runs ``cmd`` in its own session (a hang kills every process it started); its output on failure."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR",
            "MASTER_PORT", "TORCHELASTIC_RUN_ID", "ACCELERATE_USE_CPU")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("SLURM_", "PL_", "OMPI_"))}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_HOME=str(cwd / "hf_home"), PYTHONFAULTHANDLER="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    proc = subprocess.Popen([str(c) for c in cmd], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(map(str, cmd))} hung for {RUN_TIMEOUT} s\nstdout:\n{out[-4000:]}\n"
                    f"stderr:\n{err[-6000:]}", pytrace=False)
    assert proc.returncode == 0, (f"{' '.join(map(str, cmd))}: exit {proc.returncode}\nstdout:\n{out[-4000:]}\n"
                                  f"stderr:\n{err[-6000:]}")
    return out + err


def rank_logs(out_dir):
    logs = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert [log["rank"] for log in logs] == list(range(WORLD)) and all(log["world"] == WORLD for log in logs)
    return logs


def shards(logs, epoch, loader="loader"):
    """Per rank: the list of batches (index lists) it trained on in ``epoch``."""
    return [[s["idx"] for s in log["steps"] if s["epoch"] == epoch and s["loader"] == loader] for log in logs]


def check_pad_partition(per_rank, what):
    """Both ranks 7 batches, 52 records; together every record, exactly the one padding record twice."""
    print(f"{what}: batches per rank {[len(b) for b in per_rank]}, records {[sum(map(len, b)) for b in per_rank]}")
    for r, batches in enumerate(per_rank):
        assert len(batches) == STEPS, f"{what}: rank {r} trained on {len(batches)} batches, not {STEPS}"
        assert [len(b) for b in batches] == [BATCH] * (STEPS - 1) + [PER_RANK - BATCH * (STEPS - 1)], (
            f"{what}: rank {r} batch sizes {[len(b) for b in batches]}")
    seen = [i for batches in per_rank for b in batches for i in b]
    missing = sorted(set(range(N)) - set(seen))
    assert not missing, f"{what}: records {missing} were not read by any rank"
    values, counts = np.unique(seen, return_counts=True)
    assert len(seen) == WORLD * PER_RANK and counts.max() <= 2 and (counts == 2).sum() == WORLD * PER_RANK - N, (
        f"{what}: records read twice: {values[counts > 1].tolist()} (only the padding may be)")


def interleave(per_rank):
    """Rank r holds positions r, r + 2, ... of the epoch's (padded) order: that order rebuilt."""
    seqs = [[i for b in batches for i in b] for batches in per_rank]
    order = [0] * sum(map(len, seqs))
    for r, s in enumerate(seqs):
        order[r::WORLD] = s
    return order


def pad_order(epoch):
    """The Loader's own order of ``epoch`` (shuffle=True, SEED) as "pad" makes it divisible by 2: the
    permutation, then its first records again (as DistributedSampler pads)."""
    from fastpipe.data.order import epoch_order

    return np.resize(epoch_order(N, shuffle=True, seed=SEED, epoch=epoch), WORLD * PER_RANK).tolist()


LIGHTNING_SCRIPT = r'''
"""A LightningModule whose train_dataloader() returns fastpipe Loaders; 2 CPU processes under DDP."""
import json
import os
import sys

import torch
import lightning.pytorch as pl
from torch.utils.data.distributed import DistributedSampler

import fastpipe

data, out, seed, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
calls = []  # every call that reaches a Loader's iter()/set_epoch() or the sampler's set_epoch(), and its caller


def caller():
    f = sys._getframe(2)
    return f"{f.f_code.co_filename.rsplit('site-packages/', 1)[-1]}:{f.f_code.co_name}"


def spy(name):
    method = getattr(fastpipe.Loader, name)

    def logged(self, *args):
        result = method(self, *args)
        calls.append({"call": f"Loader.{name}", "loader": self.name, "args": list(args), "by": caller(),
                      "loader_epoch": self.state_dict()["epoch"]})
        return result
    setattr(fastpipe.Loader, name, logged)


spy("__iter__")
spy("set_epoch")


class LoggedSampler(DistributedSampler):
    def set_epoch(self, epoch):
        calls.append({"call": "sampler.set_epoch", "loader": "sampled", "args": [epoch], "by": caller()})
        super().set_epoch(epoch)


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.loaders = {}
        self.steps = []

    def train_dataloader(self):
        # Built here, after DDP has set up the process group: rank and world size are its.
        ds = fastpipe.NpyDataset({"idx": f"{data}/idx.npy", "x": f"{data}/x.npy"})
        self.loaders = {
            "loader": fastpipe.Loader(ds, batch_size=batch, shuffle=True, seed=seed),
            # A user's DistributedSampler (one shard, so the Loader must not shard again).
            "sampled": fastpipe.Loader(ds, batch_size=batch, sampler=LoggedSampler(ds, shuffle=True, seed=seed)),
        }
        for name, loader in self.loaders.items():
            loader.name = name
        return self.loaders

    def training_step(self, batch, i):
        for name, b in batch.items():
            self.steps.append({"epoch": self.current_epoch, "loader": name, "idx": b["idx"].tolist()})
        return self.layer(torch.cat([b["x"] for b in batch.values()])).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    net = Net()
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, use_distributed_sampler=True,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=out)
    trainer.fit(net)
    trainer.save_checkpoint(f"{out}/last.ckpt")  # every rank takes part; rank 0 writes
    kept = trainer.train_dataloader
    saved = torch.load(f"{out}/last.ckpt", weights_only=False)["loops"]["fit_loop"]["state_dict"]
    log = {"rank": trainer.global_rank, "world": trainer.world_size, "steps": net.steps, "calls": calls,
           "lightning": pl.__version__,
           "passed_through": {k: kept[k] is net.loaders[k] for k in net.loaders},
           "ranks": {k: [ld.rank, ld.world_size] for k, ld in net.loaders.items()},
           "len": {k: len(ld) for k, ld in net.loaders.items()},
           "checkpointed": saved.get("combined_loader"), "states": [ld.state_dict() for ld in net.loaders.values()]}
    with open(f"{out}/rank{trainer.global_rank}.json", "w") as f:
        json.dump(log, f)
    # Without the interpreter's teardown, which gloo's worker threads race (a rank may abort after its work:
    # benchmarks/results/gloo_exit_race_20261207.md); what the test reads is written.
    os._exit(0)
'''


@pytest.fixture(scope="module")
def lightning_run(tmp_path_factory):
    """One Lightning fit (2 epochs, 2 processes) with both Loaders; each rank's log."""
    tmp = tmp_path_factory.mktemp("lightning")
    data, out = write_data(tmp / "data"), tmp / "out"
    out.mkdir()
    script = tmp / "lightning_fastpipe.py"
    script.write_text(LIGHTNING_SCRIPT)
    launch([sys.executable, script, data, out, SEED, BATCH], cwd=tmp)
    logs = rank_logs(out)
    print(f"lightning {logs[0]['lightning']}; calls reaching rank 0's Loaders:")
    for c in logs[0]["calls"]:
        print(f"  {c}")
    for log in logs:
        assert log["passed_through"] == {"loader": True, "sampled": True}, (
            f"rank {log['rank']}: Lightning replaced a Loader: {log['passed_through']}")
        assert log["ranks"] == {"loader": [log["rank"], WORLD], "sampled": [log["rank"], WORLD]}
        assert log["len"] == {"loader": STEPS, "sampled": STEPS}
        # Lightning sets the epoch of each loader's `sampler` at each epoch's start: a Loader without one
        # stands for its own order there, so Lightning's epoch is the Loader's.
        set_epochs = {k: [c["args"] for c in log["calls"] if c["call"] == "Loader.set_epoch" and c["loader"] == k]
                      for k in ("loader", "sampled")}
        assert set_epochs == {"loader": [[e] for e in range(EPOCHS)], "sampled": []}, set_epochs
    # A Loader has state_dict()/load_state_dict(): Lightning keeps its position in the checkpoint (the fit
    # loop's "combined_loader"), rank 0's as rank 0 writes the file, and hands that to every rank's
    # load_state_dict() when it resumes mid-epoch.
    assert logs[0]["checkpointed"] == logs[0]["states"], "the checkpoint does not hold rank 0's Loader states"
    return logs


def passes(log, loader):
    """The Loader epoch of each iter() of ``loader``, in order: Lightning's check, then one per epoch."""
    return [c["loader_epoch"] for c in log["calls"] if c["call"] == "Loader.__iter__" and c["loader"] == loader]


@needs("lightning")
def test_lightning_ddp_loader(lightning_run):
    """Lightning hands each rank's Loader (shuffle=True) through as it is: no DistributedSampler injected
    (use_distributed_sampler=True, its default, concerns torch DataLoaders only), no second shard; each
    epoch is the Loader's epoch of that number, the same on both ranks."""
    logs = lightning_run
    # Lightning calls iter() once more before training, to check that the Loader is iterable; then it sets
    # the epoch (through loader.sampler) before each epoch's iter(): its epoch e is the Loader's epoch e.
    epochs = [passes(log, "loader") for log in logs]
    assert epochs[0] == epochs[1], f"the ranks' Loaders went through different epochs: {epochs}"
    print(f"Loader epochs of Lightning's iter() calls: {epochs[0]}")
    training = epochs[0][-EPOCHS:]
    assert training == list(range(EPOCHS)), f"Lightning's epochs ran as the Loader's epochs {epochs[0]}"
    orders = []
    for epoch in range(EPOCHS):
        per_rank = shards(logs, epoch)
        check_pad_partition(per_rank, f"Lightning epoch {epoch}")
        order = interleave(per_rank)
        assert order == pad_order(training[epoch]), (
            f"Lightning epoch {epoch}: the ranks' shards are not the Loader's epoch {training[epoch]}")
        orders.append(order)
    assert orders[0] != orders[1], "both epochs came in the same order"


@needs("lightning")
def test_lightning_ddp_distributed_sampler(lightning_run):
    """A Loader with the user's DistributedSampler: Lightning calls its set_epoch(epoch) at the start of each
    epoch (it reads ``loader.sampler``), and that epoch decides the order, which is DistributedSampler's own
    (the Loader does not shard again)."""
    from torch.utils.data.distributed import DistributedSampler

    logs = lightning_run
    for log in logs:
        by_lightning = [c["args"] for c in log["calls"]
                        if c["call"] == "sampler.set_epoch" and c["by"].startswith("lightning/")]
        assert by_lightning == [[e] for e in range(EPOCHS)], f"rank {log['rank']}: Lightning's set_epoch calls"
    for epoch in range(EPOCHS):
        per_rank = shards(logs, epoch, "sampled")
        check_pad_partition(per_rank, f"Lightning epoch {epoch}, DistributedSampler")
        for r in range(WORLD):
            want = DistributedSampler(range(N), num_replicas=WORLD, rank=r, shuffle=True, seed=SEED)
            want.set_epoch(epoch)
            assert [i for b in per_rank[r] for i in b] == list(want), (
                f"Lightning epoch {epoch}, rank {r}: not DistributedSampler's order of epoch {epoch} (did the "
                "Loader override the sampler's epoch?)")


@needs("lightning")
def test_lightning_ddp_sampler_epoch_is_the_pass_epoch(lightning_run):
    """The pass's epoch (the transforms' random draws) is the sampler's epoch that Lightning set."""
    for log in lightning_run:
        training = passes(log, "sampled")[-EPOCHS:]
        assert training == list(range(EPOCHS)), (
            f"rank {log['rank']}: Lightning's epochs 0..{EPOCHS - 1} ran as the Loader's epochs {training}: the "
            "transforms' draws must follow the sampler's epoch (Lightning's extra iter() before training must "
            "not shift them, nor give two epochs the same draws)")


ACCELERATE_SCRIPT = r'''
"""accelerator.prepare(model, optimizer, fastpipe.Loader), 2 CPU processes (gloo) under torchrun."""
import json
import os
import sys

import accelerate
import torch
from accelerate import Accelerator

import fastpipe

data, out, seed, batch, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
accelerator = Accelerator(cpu=True)
ds = fastpipe.NpyDataset({"idx": f"{data}/idx.npy", "x": f"{data}/x.npy"})
loader = fastpipe.Loader(ds, batch_size=batch, shuffle=True, seed=seed)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
steps, gathered, for_metrics = [], [], []
for epoch in range(epochs):
    for b in prepared:
        loss = model(b["x"]).square().mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        steps.append({"epoch": epoch, "loader": "loader", "idx": b["idx"].tolist()})
        gathered.append(accelerator.gather(b["idx"]).tolist())
        for_metrics.append(accelerator.gather_for_metrics(b["idx"]).tolist())
log = {"rank": accelerator.process_index, "world": accelerator.num_processes, "steps": steps,
       "accelerate": accelerate.__version__, "distributed_type": str(accelerator.distributed_type),
       "backend": torch.distributed.get_backend(), "passed_through": prepared is loader,
       "prepared_type": type(prepared).__name__, "rank_world": [loader.rank, loader.world_size],
       "gathered": gathered, "for_metrics": for_metrics}
with open(f"{out}/rank{accelerator.process_index}.json", "w") as f:
    json.dump(log, f)
os._exit(0)  # as the Lightning script: gloo's worker threads race the interpreter's teardown
'''


@needs("accelerate")
def test_accelerate_prepare_two_cpu_processes(tmp_path):
    """accelerator.prepare() returns the Loader itself (it prepares torch DataLoaders only): each rank reads
    the Loader's own shard; gather works on its batches (equal sizes on every rank); gather_for_metrics
    keeps the padding record (Accelerate knows only its own DataLoaders' padding)."""
    data, out = write_data(tmp_path / "data"), tmp_path / "out"
    out.mkdir()
    script = tmp_path / "accelerate_fastpipe.py"
    script.write_text(ACCELERATE_SCRIPT)
    launch([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}", script,
            data, out, SEED, BATCH, EPOCHS], cwd=tmp_path)
    logs = rank_logs(out)
    print(f"accelerate {logs[0]['accelerate']}: {logs[0]['distributed_type']} over {logs[0]['backend']}, "
          f"prepare() returned a {logs[0]['prepared_type']}")
    for log in logs:
        assert log["distributed_type"] == "DistributedType.MULTI_CPU" and log["backend"] == "gloo"
        assert log["passed_through"], f"rank {log['rank']}: prepare() wrapped the Loader in a {log['prepared_type']}"
        assert log["rank_world"] == [log["rank"], WORLD]
    orders = []
    for epoch in range(EPOCHS):
        per_rank = shards(logs, epoch)
        check_pad_partition(per_rank, f"Accelerate epoch {epoch}")
        order = interleave(per_rank)
        # Nobody calls set_epoch: the Loader counts its epochs by itself, one per iter().
        assert order == pad_order(epoch), f"epoch {epoch}: the ranks' shards are not the Loader's epoch {epoch}"
        orders.append(order)
    assert orders[0] != orders[1], "both epochs came in the same order"
    steps = [s["idx"] for s in logs[0]["steps"]]
    for log in logs:
        # gather: every rank gets every rank's batch, rank 0's first.
        want = [a + b for a, b in zip(steps, [s["idx"] for s in logs[1]["steps"]], strict=True)]
        assert log["gathered"] == want, f"rank {log['rank']}: gather differs from the ranks' batches"
        # gather_for_metrics drops padding only for loaders Accelerate prepared itself: the repeated
        # record is still there at the end of each epoch (104 values for 103 records).
        assert log["for_metrics"] == want
