"""Sharding over ranks: equal batch counts, exactly-once under "drop", DistributedSampler-like "pad"."""

import math

import numpy as np
import pytest

pytestmark = [pytest.mark.timeout(60), pytest.mark.torch_build]

N = 1_003


def shard_epochs(fp, ds, arrays, ws, policy, batch_size, epochs=1, **kw):
    """Per epoch, per rank: the list of index arrays of the rank's batches (data checked byte-exact)."""
    kw.setdefault("shuffle", True)
    loaders = [fp.loader(ds, batch_size, rank=r, world_size=ws, shard_remainder=policy, **kw) for r in range(ws)]
    lens = [len(ld) for ld in loaders]
    assert len(set(lens)) == 1, f"ranks disagree on len(loader): {lens}"
    out = []
    for _ in range(epochs):
        per_rank = []
        for r, ld in enumerate(loaders):
            batches = fp.epoch(ld)
            assert len(batches) == lens[r], f"rank {r}: {len(batches)} batches, len() said {lens[r]}"
            fp.verify(batches, arrays)
            per_rank.append([b["idx"] for b in batches])
        out.append(per_rank)
    for ld in loaders:
        ld.close()
    return out


def interleave(per_rank):
    """Rank r holds positions r, r+ws, ...: rebuild the global (padded/truncated) permutation."""
    seqs = [np.concatenate(b) if b else np.zeros(0, np.int64) for b in per_rank]
    assert len({len(s) for s in seqs}) == 1, f"ranks got different sample counts: {[len(s) for s in seqs]}"
    ws = len(seqs)
    out = np.empty(len(seqs[0]) * ws, np.int64)
    for r, s in enumerate(seqs):
        out[r::ws] = s
    return out


@pytest.mark.parametrize("ws", [1, 2, 3, 4])
@pytest.mark.parametrize("policy", ["pad", "drop"])
def test_exactly_once_sharding(dataset_factory, fp, ws, policy):
    ds, arrays, _ = dataset_factory(N, {"x": ("uint8", (3,))})
    batch = 16
    [per_rank] = shard_epochs(fp, ds, arrays, ws, policy, batch)
    counts = [sum(len(b) for b in r) for r in per_rank]
    nbatches = [len(r) for r in per_rank]
    print(f"ws={ws} policy={policy} samples per rank {counts}, batches per rank {nbatches}")
    assert len(set(nbatches)) == 1, "every rank must get the same number of batches"
    assert len(set(counts)) == 1, "every rank must get the same number of samples"
    all_idx = np.concatenate([np.concatenate(r) for r in per_rank]).tolist()
    if policy == "drop":
        assert len(all_idx) == (N // ws) * ws
        assert len(set(all_idx)) == len(all_idx), "a record appeared twice across ranks with 'drop'"
        per = N // ws
    else:
        assert len(all_idx) == math.ceil(N / ws) * ws
        assert set(all_idx) == set(range(N)), "a record is missing with 'pad'"
        per = math.ceil(N / ws)
        # exactly the padding is duplicated, no record more than twice
        vals, cnt = np.unique(all_idx, return_counts=True)
        assert cnt.sum() - len(vals) == math.ceil(N / ws) * ws - N
        assert cnt.max() <= 2
    assert counts[0] == per
    assert nbatches[0] == math.ceil(per / batch)
    # each rank's batches are full except possibly the last
    for r in per_rank:
        assert all(len(b) == batch for b in r[:-1])


@pytest.mark.parametrize("ws", [2, 3, 4])
@pytest.mark.parametrize("policy", ["pad", "drop"])
def test_shards_interleave_to_the_single_rank_permutation(dataset_factory, fp, ws, policy):
    """Contract: one permutation per (seed, epoch), made divisible by ws (pad repeats its start, drop cuts
    the tail), rank r taking positions r, r+ws, ..."""
    ds, arrays, _ = dataset_factory(N, {})
    [[single]] = shard_epochs(fp, ds, arrays, 1, policy, 1_024, seed=17)
    perm = np.concatenate(single)
    [per_rank] = shard_epochs(fp, ds, arrays, ws, policy, 1_024, seed=17)
    got = interleave(per_rank)
    if policy == "drop":
        want = perm[: (N // ws) * ws]
    else:
        total = math.ceil(N / ws) * ws
        want = np.concatenate([perm, perm[: total - N]])
    assert got.tolist() == want.tolist()


def test_unshuffled_pad_matches_distributed_sampler(dataset_factory, fp):
    """shuffle=False, ws=2, N=1003 -> rank 0: 0,2,...,1002; rank 1: 1,3,...,1001, then 0 (padding)."""
    ds, arrays, _ = dataset_factory(N, {})
    out = []
    for r in range(2):
        ld = fp.loader(ds, 100, rank=r, world_size=2, shard_remainder="pad")
        out.append(fp.verify(fp.epoch(ld), arrays).tolist())
    assert out[0] == list(range(0, N, 2))
    assert out[1] == list(range(1, N, 2)) + [0]

    from torch.utils.data.distributed import DistributedSampler

    for r in range(2):
        ref = list(DistributedSampler(range(N), num_replicas=2, rank=r, shuffle=False))
        assert out[r] == ref


def test_unshuffled_drop(dataset_factory, fp):
    ds, arrays, _ = dataset_factory(N, {})
    out = [fp.verify(fp.epoch(fp.loader(ds, 64, rank=r, world_size=4, shard_remainder="drop")), arrays).tolist()
           for r in range(4)]
    for r in range(4):
        assert out[r] == list(range(r, 1_000, 4))


@pytest.mark.parametrize("policy", ["pad", "drop"])
def test_epochs_reshuffle_consistently_across_ranks(dataset_factory, fp, policy):
    ws = 3
    ds, arrays, _ = dataset_factory(N, {})
    epochs = shard_epochs(fp, ds, arrays, ws, policy, 32, epochs=3, seed=4)
    globals_ = []
    for e, per_rank in enumerate(epochs):
        all_idx = np.concatenate([np.concatenate(r) for r in per_rank]).tolist()
        if policy == "drop":
            assert len(set(all_idx)) == len(all_idx) == (N // ws) * ws, f"epoch {e}"
        else:
            assert set(all_idx) == set(range(N)), f"epoch {e}"
        globals_.append(interleave(per_rank).tolist())
    assert globals_[0] != globals_[1] and globals_[1] != globals_[2] and globals_[0] != globals_[2]


@pytest.mark.parametrize("policy", ["pad", "drop"])
def test_drop_last_with_ranks(dataset_factory, fp, policy):
    ws, batch = 4, 30
    ds, arrays, _ = dataset_factory(N, {})
    per = math.ceil(N / ws) if policy == "pad" else N // ws
    counts = []
    seen = []
    for r in range(ws):
        ld = fp.loader(ds, batch, shuffle=True, seed=2, rank=r, world_size=ws, shard_remainder=policy, drop_last=True)
        batches = fp.epoch(ld)
        assert len(ld) == len(batches) == per // batch
        assert all(len(b["idx"]) == batch for b in batches)
        counts.append(len(batches))
        seen.extend(fp.verify(batches, arrays).tolist())
    assert len(set(counts)) == 1
    if policy == "drop":
        assert len(set(seen)) == len(seen)


def test_small_dataset_more_ranks_than_batches(dataset_factory, fp):
    ds, arrays, _ = dataset_factory(5, {})
    got = []
    for r in range(4):
        ld = fp.loader(ds, 8, shuffle=True, rank=r, world_size=4, shard_remainder="pad")
        assert len(ld) == 1
        b = fp.epoch(ld)
        assert len(b) == 1 and len(b[0]["idx"]) == 2
        got.extend(b[0]["idx"].tolist())
    assert set(got) == set(range(5)) and len(got) == 8


def test_bad_rank_or_policy(dataset_factory, fp):
    ds, _, _ = dataset_factory(20, {})
    with pytest.raises(ValueError):
        fp.loader(ds, 4, rank=0, world_size=2, shard_remainder="wrap")
    with pytest.raises(ValueError):
        fp.loader(ds, 4, rank=2, world_size=2)
    with pytest.raises(ValueError):
        fp.loader(ds, 4, rank=-1, world_size=2)
    with pytest.raises(ValueError):
        fp.loader(ds, 4, rank=0, world_size=0)


def test_defaults_without_torch_distributed(dataset_factory, fp):
    import torch.distributed as dist

    assert not (dist.is_available() and dist.is_initialized())
    ds, arrays, _ = dataset_factory(N, {})
    ld = fp.loader(ds, 100)
    assert len(ld) == 11
    assert fp.verify(fp.epoch(ld), arrays).tolist() == list(range(N))


@pytest.fixture
def fake_process_group():
    """init(rank, world_size): a real torch.distributed process group of the in-process "fake" backend
    (torch's own test backend: no peers, no network), destroyed after the test."""
    import torch.distributed as dist

    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError:
        pytest.skip("torch's fake process group backend is unavailable")

    def init(rank, world_size):
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
        assert dist.get_rank() == rank and dist.get_world_size() == world_size

    yield init
    if dist.is_initialized():
        dist.destroy_process_group()


def test_defaults_from_torch_distributed(dataset_factory, fp, fake_process_group):
    """With torch.distributed initialised, rank/world_size default to its rank and world size."""
    import torch.distributed as dist

    ws = 3
    ds, arrays, _ = dataset_factory(N, {"x": ("uint8", (3,))})
    for policy in ("pad", "drop"):
        per_rank = []
        for r in range(ws):
            fake_process_group(r, ws)
            ld = fp.loader(ds, 50, shuffle=True, seed=9, shard_remainder=policy)
            got = fp.epoch(ld)
            ld.close()
            dist.destroy_process_group()
            explicit = fp.epoch(fp.loader(ds, 50, shuffle=True, seed=9, shard_remainder=policy, rank=r, world_size=ws))
            assert fp.same_batches(got, explicit), f"rank {r}: defaults differ from rank={r}, world_size={ws}"
            per_rank.append(fp.verify(got, arrays).tolist())
        all_idx = sum(per_rank, [])
        if policy == "pad":
            assert set(all_idx) == set(range(N)) and len(all_idx) == math.ceil(N / ws) * ws
        else:
            assert len(set(all_idx)) == len(all_idx) == (N // ws) * ws
    # explicit arguments win over the process group
    fake_process_group(2, ws)
    ld = fp.loader(ds, 50, rank=0, world_size=1)
    assert fp.verify(fp.epoch(ld), arrays).tolist() == list(range(N))
