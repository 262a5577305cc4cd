"""DataLoader's batch_sampler, worker_init_fn and multiprocessing_context given to the Loader: the batches a
batch sampler lists, compared with DataLoader's over the same records."""

import numpy as np
import pytest
import torch

import fastpipe


def dataloader_batches(arrays, **kw):
    """DataLoader's batches of the records' indices: the reference order."""
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.from_numpy(arrays["idx"])), **kw)
    return [b[0].tolist() for b in dl]


def random_batches(n, batch_size, drop_last, seed):
    return torch.utils.data.BatchSampler(
        torch.utils.data.RandomSampler(range(n), generator=torch.Generator().manual_seed(seed)), batch_size, drop_last)


@pytest.mark.parametrize("drop_last", [False, True])
def test_torch_batch_sampler(dataset_factory, fp, rng, drop_last):
    n, bs = int(rng.integers(90, 140)), int(rng.integers(5, 17))
    ds, arrays, _ = dataset_factory(n, {"x": ("float32", (3,)), "y": ("uint8", (5,))})
    seed = int(rng.integers(1 << 30))
    ld = fp.loader(ds, batch_sampler=random_batches(n, bs, drop_last, seed))
    want = dataloader_batches(arrays, batch_sampler=random_batches(n, bs, drop_last, seed))
    assert (ld.batch_size, ld.drop_last, len(ld)) == (bs, drop_last, len(want))
    got = fp.epoch(ld)
    fp.verify(got, arrays)
    assert fp.batch_idx(got) == want
    flat = sum(want, [])
    assert len(set(flat)) == len(flat) == (n - n % bs if drop_last else n)


class ByLabel:
    """A batch sampler of the kind scripts write: each batch one label's indices, the labels' batches
    interleaved; the labels' remainders pooled into batches at the end (only the last may be short)."""

    def __init__(self, labels, batch_size, seed):
        self.labels, self.batch_size, self.seed = labels, batch_size, seed
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def _batches(self):
        g = np.random.default_rng([self.seed, self.epoch])
        full, rest = [], []
        for label in np.unique(self.labels):
            idx = g.permutation(np.flatnonzero(self.labels == label))
            cut = len(idx) - len(idx) % self.batch_size
            full += [idx[i:i + self.batch_size] for i in range(0, cut, self.batch_size)]
            rest += idx[cut:].tolist()
        full = [full[i] for i in g.permutation(len(full))]
        tail = [rest[i:i + self.batch_size] for i in range(0, len(rest), self.batch_size)]
        return full + [torch.tensor(b) for b in tail]  # tensors and arrays both count as batches

    def __iter__(self):
        return iter(self._batches())

    def __len__(self):
        return len(self._batches())


def test_custom_batch_sampler_and_its_epoch(dataset_factory, fp, rng):
    n, bs = 157, 8
    ds, arrays, _ = dataset_factory(n, {"x": ("int16", (2,))})
    labels = rng.integers(0, 4, n)
    seed = int(rng.integers(1 << 30))
    mine, theirs = ByLabel(labels, bs, seed), ByLabel(labels, bs, seed)
    ld = fp.loader(ds, batch_sampler=mine)
    for epoch in (0, 3):
        ld.set_epoch(epoch)  # forwarded to the batch sampler, which decides the order
        theirs.set_epoch(epoch)
        want = dataloader_batches(arrays, batch_sampler=theirs)
        got = fp.epoch(ld)
        fp.verify(got, arrays)
        assert mine.epoch == epoch
        assert fp.batch_idx(got) == want
        full = sum(c // bs for c in np.unique(labels, return_counts=True)[1])
        assert all(len(set(labels[b])) == 1 for b in want[:full]), "the batches are the sampler's, label by label"
    # set on the batch sampler itself, as scripts do with a DistributedSampler
    mine.set_epoch(5)
    theirs.set_epoch(5)
    assert fp.batch_idx(fp.epoch(ld)) == dataloader_batches(arrays, batch_sampler=theirs)
    assert ld.sampler.epoch == 5


def test_batch_sampler_resumes(dataset_factory, fp, rng):
    """A BatchSampler over a DistributedSampler (its order a function of the epoch): state_dict mid-epoch
    resumes the batches not yet read."""
    n, bs = 203, 16
    ds, arrays, _ = dataset_factory(n, {"x": ("uint8", (7,))})

    def loader():
        sampler = torch.utils.data.DistributedSampler(range(n), num_replicas=1, rank=0, shuffle=True, seed=11)
        return fp.loader(ds, batch_sampler=torch.utils.data.BatchSampler(sampler, bs, False)), sampler

    ld, sampler = loader()
    sampler.set_epoch(2)
    whole = fp.batch_idx(fp.epoch(ld))
    sampler.set_epoch(2)
    it = iter(ld)
    first = fp.batch_idx(fp.take(it, 5))
    state = ld.state_dict()
    del it
    ld2, sampler2 = loader()
    ld2.load_state_dict(state)
    sampler2.set_epoch(2)
    rest = fp.batch_idx(fp.epoch(ld2))
    assert first + rest == whole


@pytest.mark.parametrize("sizes,bad", [([4, 3, 4], "batch 1 has 3 indices and batch 2 follows it"),
                                       ([4, 5], "batch 1 has 5 indices"), ([4, 0], "batch 1 has 0 indices")])
def test_batches_of_another_size_are_refused(dataset_factory, fp, sizes, bad):
    ds, _, _ = dataset_factory(20, {})

    class Sizes:
        batch_size = 4

        def __iter__(self):
            start = 0
            for s in sizes:
                yield list(range(start, start + s))
                start += s

        def __len__(self):
            return len(sizes)

    ld = fp.loader(ds, batch_sampler=Sizes())
    with pytest.raises(ValueError, match=bad):
        fp.epoch(ld)


def test_batch_sampler_refusals(dataset_factory, fp):
    ds, _, _ = dataset_factory(20, {})
    batches = torch.utils.data.BatchSampler(range(20), 4, False)
    for kw in ({"batch_size": 4}, {"shuffle": True}, {"sampler": range(20)}, {"drop_last": True}):
        with pytest.raises(ValueError, match="mutually exclusive"):
            fp.loader(ds, batch_sampler=batches, **kw)
    with pytest.raises(TypeError, match="batch_size=None .* use batch_size=1"):
        fp.loader(ds, None)
    with pytest.raises(TypeError, match="no batch_size attribute"):
        fp.loader(ds, batch_sampler=[[0, 1], [2, 3]])
    with pytest.raises(TypeError, match="iterable of batches"):
        fp.loader(ds, batch_sampler=object())

    class Sized(list):
        batch_size = 0

    with pytest.raises(ValueError, match="batch_sampler.batch_size"):
        fp.loader(ds, batch_sampler=Sized([[0]]))


def test_worker_keywords_are_taken_unused(dataset_factory, fp, rng):
    """A script's worker_init_fn (torch's reproducibility recipe) and multiprocessing_context: no worker
    runs, so the function is never called, and the order and draws are the seed's."""
    ds, arrays, _ = dataset_factory(64, {"x": ("float32", (2,))})
    called = []
    g = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
    ld = fp.loader(ds, 8, shuffle=True, worker_init_fn=called.append, generator=g, num_workers=2,
                   multiprocessing_context="spawn")
    plain = fp.loader(ds, 8, shuffle=True, seed=g.initial_seed())
    assert fp.batch_idx(fp.epoch(ld)) == fp.batch_idx(fp.epoch(plain))
    assert called == []
