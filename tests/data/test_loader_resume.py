"""state_dict / load_state_dict: a fresh loader resumes with exactly the remaining batches."""

import json

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(60)

N, B = 1_003, 32  # 32 batches per epoch, the last of 11 records


def roundtrip(sd):
    text = json.dumps(sd)  # must be JSON-serialisable as is (no default=)
    return json.loads(text)


@pytest.fixture
def setup(dataset_factory):
    ds, arrays, _ = dataset_factory(N, {"x": ("uint8", (13,)), "y": ("float32", (3,))})
    return ds, arrays


def reference(fp, ds, epochs=3, **kw):
    ld = fp.loader(ds, B, shuffle=True, seed=31, **kw)
    out = [fp.epoch(ld) for _ in range(epochs)]
    ld.close()
    return out


def describe(a, b, fp):
    ia, ib = fp.batch_idx(a), fp.batch_idx(b)
    return f"{len(ia)} batches vs {len(ib)}; first idx {ia[:1]} vs {ib[:1]}"


@pytest.mark.parametrize("k", [0, 1, 16, 31, 32], ids=["start", "after-one", "midway", "before-last", "at-last"])
def test_resume_within_first_epoch(fp, setup, k):
    ds, arrays = setup
    ref = reference(fp, ds)
    a = fp.loader(ds, B, shuffle=True, seed=31)
    it = iter(a)
    consumed = fp.take(it, k)
    assert fp.same_batches(consumed, ref[0][:k])
    sd = roundtrip(a.state_dict())
    del it
    a.close()

    b = fp.loader(ds, B, shuffle=True, seed=31)
    b.load_state_dict(sd)
    assert roundtrip(b.state_dict()) == sd, "state_dict() right after load_state_dict() is the loaded state"
    rest = fp.epoch(b)
    fp.verify(rest, arrays)
    if k < len(ref[0]):
        assert fp.same_batches(rest, ref[0][k:]), describe(rest, ref[0][k:], fp)
        # and the epoch after is the uninterrupted run's second epoch
        assert fp.same_batches(fp.epoch(b), ref[1])
    else:
        # taken after the last batch: the next iteration is the next epoch
        assert fp.same_batches(rest, ref[1]), describe(rest, ref[1], fp)
        assert fp.same_batches(fp.epoch(b), ref[2])


def test_resume_before_any_iter(fp, setup):
    ds, _ = setup
    ref = reference(fp, ds, epochs=2)
    a = fp.loader(ds, B, shuffle=True, seed=31)
    sd = roundtrip(a.state_dict())
    b = fp.loader(ds, B, shuffle=True, seed=31)
    b.load_state_dict(sd)
    assert fp.same_batches(fp.epoch(b), ref[0])
    assert fp.same_batches(fp.epoch(b), ref[1])


def test_resume_after_exhausted_epoch(fp, setup):
    ds, _ = setup
    ref = reference(fp, ds)
    a = fp.loader(ds, B, shuffle=True, seed=31)
    fp.epoch(a)  # StopIteration reached
    sd = roundtrip(a.state_dict())
    b = fp.loader(ds, B, shuffle=True, seed=31)
    b.load_state_dict(sd)
    assert fp.same_batches(fp.epoch(b), ref[1])


@pytest.mark.parametrize("k", [0, 1, 20, 32])
def test_resume_across_epoch_boundary(fp, setup, k):
    ds, _ = setup
    ref = reference(fp, ds)
    a = fp.loader(ds, B, shuffle=True, seed=31)
    assert fp.same_batches(fp.epoch(a), ref[0])
    it = iter(a)
    assert fp.same_batches(fp.take(it, k), ref[1][:k])
    sd = roundtrip(a.state_dict())
    b = fp.loader(ds, B, shuffle=True, seed=31)
    b.load_state_dict(sd)
    rest = fp.epoch(b)
    want = ref[1][k:] if k < 32 else ref[2]
    assert fp.same_batches(rest, want), describe(rest, want, fp)


def test_resume_of_a_resumed_loader(fp, setup):
    ds, _ = setup
    ref = reference(fp, ds, epochs=2)
    a = fp.loader(ds, B, shuffle=True, seed=31)
    it = iter(a)
    fp.take(it, 5)
    sd = roundtrip(a.state_dict())
    b = fp.loader(ds, B, shuffle=True, seed=31, num_threads=3)  # threads are not part of the state
    b.load_state_dict(sd)
    itb = iter(b)
    assert fp.same_batches(fp.take(itb, 7), ref[0][5:12])
    sd2 = roundtrip(b.state_dict())
    c = fp.loader(ds, B, shuffle=True, seed=31, num_threads=1)
    c.load_state_dict(sd2)
    assert fp.same_batches(fp.epoch(c), ref[0][12:])
    assert fp.same_batches(fp.epoch(c), ref[1])


def test_load_state_into_the_same_loader_mid_epoch(fp, setup):
    """load_state_dict on a loader that is itself mid-epoch rewinds it to the saved point."""
    ds, _ = setup
    ref = reference(fp, ds, epochs=1)
    a = fp.loader(ds, B, shuffle=True, seed=31)
    it = iter(a)
    fp.take(it, 3)
    sd = roundtrip(a.state_dict())
    fp.take(it, 10)
    del it
    a.load_state_dict(sd)
    assert fp.same_batches(fp.epoch(a), ref[0][3:])


def test_resume_after_set_epoch(fp, setup):
    ds, _ = setup
    a = fp.loader(ds, B, shuffle=True, seed=31)
    a.set_epoch(7)
    full = fp.epoch(a)
    a.set_epoch(7)
    it = iter(a)
    fp.take(it, 9)
    sd = roundtrip(a.state_dict())
    b = fp.loader(ds, B, shuffle=True, seed=31)
    b.load_state_dict(sd)
    assert fp.same_batches(fp.epoch(b), full[9:])
    assert b.epoch == 8


@pytest.mark.parametrize("policy", ["pad", "drop"])
def test_resume_sharded_with_drop_last(fp, setup, policy):
    ds, _ = setup
    kw = dict(shuffle=True, seed=5, rank=1, world_size=3, shard_remainder=policy, drop_last=True)
    ref_loader = fp.loader(ds, 16, **kw)
    ref = fp.epoch(ref_loader)
    assert len(ref) == len(ref_loader)
    a = fp.loader(ds, 16, **kw)
    it = iter(a)
    fp.take(it, 4)
    sd = roundtrip(a.state_dict())
    b = fp.loader(ds, 16, **kw)
    b.load_state_dict(sd)
    assert fp.same_batches(fp.epoch(b), ref[4:])


def test_resume_unshuffled(fp, setup):
    ds, arrays = setup
    a = fp.loader(ds, B)
    it = iter(a)
    fp.take(it, 10)
    sd = roundtrip(a.state_dict())
    b = fp.loader(ds, B)
    b.load_state_dict(sd)
    idx = fp.verify(fp.epoch(b), arrays)
    assert idx.tolist() == list(range(10 * B, N))


def test_resume_token_dataset(tmp_path, rng, fp):
    import fastpipe

    tokens = rng.integers(0, 65536, size=30_001, dtype=np.uint16)
    path = tmp_path / "tok.bin"
    tokens.tofile(path)
    ds = fastpipe.TokenDataset(str(path), 100)
    ref = fp.epoch(fp.loader(ds, 8, shuffle=True, seed=1))
    a = fp.loader(ds, 8, shuffle=True, seed=1)
    it = iter(a)
    fp.take(it, 13)
    sd = roundtrip(a.state_dict())
    b = fp.loader(ds, 8, shuffle=True, seed=1)
    b.load_state_dict(sd)
    assert fp.same_batches(fp.epoch(b), ref[13:])


@pytest.mark.parametrize(
    "change",
    [
        {"batch_size": 16},
        {"seed": 32},
        {"shuffle": False},
        {"drop_last": True},
        {"dataset": "shorter"},
    ],
    ids=["batch_size", "seed", "shuffle", "drop_last", "dataset-length"],
)
def test_incompatible_state_is_rejected(fp, setup, dataset_factory, change):
    ds, _ = setup
    a = fp.loader(ds, B, shuffle=True, seed=31)
    it = iter(a)
    fp.take(it, 2)
    sd = roundtrip(a.state_dict())
    kw = dict(batch_size=B, shuffle=True, seed=31)
    kw.update(change)
    other = ds
    if kw.pop("dataset", None) == "shorter":
        other, _, _ = dataset_factory(N - 1, {"x": ("uint8", (13,)), "y": ("float32", (3,))})
    bs = kw.pop("batch_size")
    b = fp.loader(other, bs, **kw)
    with pytest.raises(ValueError) as ei:
        b.load_state_dict(sd)
    print(ei.value)
    key = next(iter(change))
    if key != "dataset":
        words = {"batch_size": "batch", "seed": "seed", "shuffle": "shuffle", "drop_last": "drop"}
        assert words[key] in str(ei.value).lower(), f"message does not name {key}: {ei.value}"


# ---------------------------------------------------------------- every way the position can change
# Each test checks state_dict() against the batches a fresh loader yields from it, and against the
# uninterrupted reference run.


def position(ld):
    sd = ld.state_dict()
    return sd["epoch"], sd["batch"]


def resumes_to(fp, ds, sd, want):
    """A fresh loader resumed from sd yields exactly `want` (a list of numpy batches)."""
    b = fp.loader(ds, B, shuffle=True, seed=31)
    b.load_state_dict(roundtrip(sd))
    got = fp.epoch(b)
    assert fp.same_batches(got, want), describe(got, want, fp)


def test_break_then_set_epoch(fp, setup):
    ds, _ = setup
    ref = reference(fp, ds, epochs=6)
    a = fp.loader(ds, B, shuffle=True, seed=31)
    for i, _ in enumerate(a):
        if i == 2:
            break
    assert position(a) == (0, 3), "after a break the live iterator's next batch is the position"
    a.set_epoch(5)
    assert position(a) == (5, 0)
    resumes_to(fp, ds, a.state_dict(), ref[5])
    assert fp.same_batches(fp.epoch(a), ref[5])


def test_break_then_a_new_iter(fp, setup):
    ds, _ = setup
    ref = reference(fp, ds, epochs=2)
    a = fp.loader(ds, B, shuffle=True, seed=31)
    for i, _ in enumerate(a):
        if i == 4:
            break
    it = iter(a)  # a new pass: the next epoch
    assert position(a) == (1, 0)
    assert fp.same_batches(fp.take(it, 2), ref[1][:2])
    assert position(a) == (1, 2)
    resumes_to(fp, ds, a.state_dict(), ref[1][2:])


def test_two_iterators_at_once(fp, setup):
    ds, _ = setup
    ref = reference(fp, ds, epochs=2)
    a = fp.loader(ds, B, shuffle=True, seed=31)
    first = iter(a)
    assert fp.same_batches(fp.take(first, 3), ref[0][:3])
    second = iter(a)
    with pytest.raises(RuntimeError, match="superseded by a newer iter"):
        next(first)
    assert position(a) == (1, 0), "the newest iterator owns the position"
    assert fp.same_batches(fp.take(second, 1), ref[1][:1])
    with pytest.raises(RuntimeError, match="superseded"):
        next(first)  # still superseded, and it did not disturb the new pass
    assert fp.same_batches(fp.epoch(second), ref[1][1:])


@pytest.mark.parametrize("then", ["set_epoch", "load_state_dict"])
def test_an_iterator_is_superseded_by_a_new_position(fp, setup, then):
    ds, _ = setup
    ref = reference(fp, ds, epochs=3)
    a = fp.loader(ds, B, shuffle=True, seed=31)
    it = iter(a)
    fp.take(it, 2)
    sd = a.state_dict()
    fp.take(it, 3)
    if then == "set_epoch":
        a.set_epoch(2)
        want, pos = ref[2], (2, 0)
    else:
        a.load_state_dict(sd)
        want, pos = ref[0][2:], (0, 2)
    with pytest.raises(RuntimeError, match=f"superseded by {then}"):
        next(it)
    assert position(a) == pos
    assert fp.same_batches(fp.epoch(a), want)


def test_resume_then_set_epoch(fp, setup):
    """load_state_dict() then set_epoch(): the explicit epoch wins and starts at its first batch."""
    ds, _ = setup
    ref = reference(fp, ds, epochs=3)
    a = fp.loader(ds, B, shuffle=True, seed=31)
    it = iter(a)
    fp.take(it, 6)
    b = fp.loader(ds, B, shuffle=True, seed=31)
    b.load_state_dict(roundtrip(a.state_dict()))
    assert position(b) == (0, 6)
    b.set_epoch(2)
    assert position(b) == (2, 0)
    resumes_to(fp, ds, b.state_dict(), ref[2])
    assert fp.same_batches(fp.epoch(b), ref[2])


def test_resume_then_set_epoch_of_the_loaded_epoch_keeps_the_position(fp, setup):
    """The resuming script's idiom: ``for epoch in range(start, n): loader.set_epoch(epoch)``."""
    ds, _ = setup
    ref = reference(fp, ds, epochs=2)
    b = fp.loader(ds, B, shuffle=True, seed=31)
    b.load_state_dict({**b.state_dict(), "epoch": 1, "batch": 4})
    b.set_epoch(1)
    assert position(b) == (1, 4)
    assert fp.same_batches(fp.epoch(b), ref[1][4:])
    b.set_epoch(1)  # nothing loaded any more: a plain set_epoch restarts the epoch
    assert position(b) == (1, 0)


def test_resumed_then_partly_iterated_then_set_epoch(fp, setup):
    ds, _ = setup
    ref = reference(fp, ds, epochs=2)
    b = fp.loader(ds, B, shuffle=True, seed=31)
    b.load_state_dict({**b.state_dict(), "epoch": 0, "batch": 30})
    it = iter(b)
    assert fp.same_batches(fp.take(it, 1), ref[0][30:31])
    assert position(b) == (0, 31)
    b.set_epoch(1)
    assert position(b) == (1, 0)
    assert fp.same_batches(fp.epoch(b), ref[1])


def test_state_after_the_last_batch(fp, setup):
    ds, _ = setup
    ref = reference(fp, ds, epochs=2)
    a = fp.loader(ds, B, shuffle=True, seed=31)
    it = iter(a)
    fp.take(it, len(a))  # every batch, StopIteration not reached yet
    assert position(a) == (1, 0)
    with pytest.raises(StopIteration):
        next(it)
    assert position(a) == (1, 0)
    resumes_to(fp, ds, a.state_dict(), ref[1])


class EpochPermutation:
    """A custom sampler: a seeded permutation of a subset, new each epoch (set_epoch)."""

    def __init__(self, n, seed):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
        return iter(order[: self.n - 50].tolist())

    def __len__(self):
        return self.n - 50


def test_resume_with_a_custom_sampler(fp, setup):
    """A sampler with an epoch: the script sets it each epoch (fastpipe never does on its own), the order
    and the position follow it, and a fresh loader whose sampler the script sets to the saved epoch
    resumes exactly."""
    ds, arrays = setup

    def sampler_at(epoch):
        s = EpochPermutation(N, 4)
        s.set_epoch(epoch)
        return s

    full_sampler = EpochPermutation(N, 4)
    full = fp.loader(ds, B, sampler=full_sampler)
    ref = []
    for e in range(2):
        full_sampler.set_epoch(e)
        ref.append(fp.epoch(full))
    for e in range(2):  # the reference follows the sampler, and the sampler's epochs differ
        assert np.concatenate(fp.batch_idx(ref[e])).tolist() == list(sampler_at(e))
        fp.verify(ref[e], arrays)
    sampler = EpochPermutation(N, 4)
    a = fp.loader(ds, B, sampler=sampler)
    sampler.set_epoch(1)
    it = iter(a)
    fp.take(it, 7)
    sd = roundtrip(a.state_dict())
    assert (sd["epoch"], sd["batch"]) == (1, 7)
    resumed_sampler = EpochPermutation(N, 4)
    b = fp.loader(ds, B, sampler=resumed_sampler)
    b.load_state_dict(sd)
    resumed_sampler.set_epoch(sd["epoch"])
    assert fp.same_batches(fp.epoch(b), ref[1][7:])


def test_one_ranks_state_resumes_every_rank(fp, setup):
    """Lightning checkpoints rank 0's state and loads it on every rank: the position is the same on all."""
    ds, _ = setup
    kw = dict(shuffle=True, seed=5, world_size=3)
    saved = fp.loader(ds, 16, rank=0, **kw)
    fp.take(iter(saved), 5)
    sd = roundtrip(saved.state_dict())
    for rank in (1, 2):
        ref = fp.epoch(fp.loader(ds, 16, rank=rank, **kw))
        b = fp.loader(ds, 16, rank=rank, **kw)
        b.load_state_dict(sd)
        assert fp.same_batches(fp.epoch(b), ref[5:])


@pytest.mark.parametrize(
    "bad,error,message",
    [
        (lambda sd: "not a dict", TypeError, "state must be a dict"),
        (lambda sd: {"epoch": 0, "batch": 0}, ValueError, "not a fastpipe Loader state"),
        (lambda sd: {**sd, "format": "fastpipe.Loader/0"}, ValueError, "not a fastpipe Loader state"),
        (lambda sd: {**sd, "batch": 33}, ValueError, "batch 33 is out of range for 32 batches"),
        (lambda sd: {**sd, "batch": -1}, ValueError, r"state\['batch'\] must be at least 0, got -1"),
        (lambda sd: {**sd, "batch": 1.5}, TypeError, r"state\['batch'\] must be an int, got float 1.5"),
        (lambda sd: {**sd, "batch": True}, TypeError, r"state\['batch'\] must be an int, got bool True"),
        (lambda sd: {**sd, "epoch": "3"}, TypeError, r"state\['epoch'\] must be an int, got str '3'"),
        (lambda sd: {k: v for k, v in sd.items() if k != "epoch"}, TypeError,
         r"state\['epoch'\] must be an int, got NoneType"),
        (lambda sd: {**sd, "offset": N + 1}, ValueError, rf"state\['offset'\] must be at most {N} \(the dataset's size\)"),
        (lambda sd: {**sd, "shard_remainder": "drop"}, ValueError, "saved with shard_remainder='drop'"),
    ],
    ids=["type", "no-format", "old-format", "batch-past-end", "negative-batch", "float-batch", "bool-batch",
         "str-epoch", "no-epoch", "offset", "shard_remainder"],
)
def test_malformed_or_foreign_state_is_rejected_and_changes_nothing(fp, setup, bad, error, message):
    ds, _ = setup
    ref = reference(fp, ds, epochs=1)
    a = fp.loader(ds, B, shuffle=True, seed=31)
    it = iter(a)
    fp.take(it, 4)
    before = a.state_dict()
    with pytest.raises(error, match=message):
        a.load_state_dict(bad(before))
    assert a.state_dict() == before
    assert fp.same_batches(fp.epoch(it), ref[0][4:]), "a rejected state disturbed the live iterator"
