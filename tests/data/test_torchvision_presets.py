"""What training scripts hand DataLoader, handed to fastpipe.Loader unchanged: pipelines wrapped in preset
objects (written here as torchvision's classification references write theirs, not copied), the weights'
own ImageClassification, v2's ToPureTensor, a collate_fn, and a sampler whose epoch the script sets.
Checked against torchvision's own DataLoader on the same files where the pipeline is deterministic."""

import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler, default_collate
from torch.utils.data._utils.collate import default_collate as collate_by_its_module_path

import fastpipe
from fastpipe.data import _dataloader_args
from fastpipe.data.torchvision_compat import convert_transform

from jpegs import EXACT_TOL, make_tree

tv = pytest.importorskip("torchvision")
T1 = tv.transforms
T2 = pytest.importorskip("torchvision.transforms.v2")
IM = T1.InterpolationMode
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
pytestmark = [pytest.mark.timeout(120, method="thread"), pytest.mark.torch_build]


class TrainPreset:
    """A recipe's training transform as the references build it: a Compose in an attribute, and a
    __call__ that only delegates to it."""

    def __init__(self, crop, interpolation=IM.BILINEAR, backend="pil", v2=False, erase=0.0):
        T = T2 if v2 else T1
        steps = [T.PILToTensor()] if backend == "tensor" else []
        steps += [T.RandomResizedCrop(crop, interpolation=interpolation, antialias=True), T.RandomHorizontalFlip(0.5)]
        if backend == "pil":
            steps.append(T.PILToTensor())
        steps += [T.ToDtype(torch.float, scale=True) if v2 else T.ConvertImageDtype(torch.float), T.Normalize(MEAN, STD)]
        if erase:
            steps.append(T.RandomErasing(p=erase))
        if v2:
            steps.append(T.ToPureTensor())
        self.transforms = T.Compose(steps)

    def __call__(self, img):
        return self.transforms(img)


class EvalPreset:
    """The evaluation side: Resize + CenterCrop; its __call__ assigns, then returns."""

    def __init__(self, crop, resize, interpolation=IM.BILINEAR, backend="pil", v2=False):
        T = T2 if v2 else T1
        steps = [T.PILToTensor()] if backend == "tensor" else []
        steps += [T.Resize(resize, interpolation=interpolation, antialias=True), T.CenterCrop(crop)]
        if backend == "pil":
            steps.append(T.PILToTensor())
        steps += [T.ToDtype(torch.float, scale=True) if v2 else T.ConvertImageDtype(torch.float), T.Normalize(MEAN, STD)]
        if v2:
            steps.append(T.ToPureTensor())
        self.pipeline = T.Compose(steps)

    def __call__(self, img):
        """Delegates."""
        img = self.pipeline(img)
        return img


class ModulePreset(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("presets")
    make_tree(str(r), np.random.default_rng(), [(75, 100), (100, 75), (61, 89), (40, 40), (90, 30), (52, 70)])
    return str(r)


def assert_matches_dataloader(dataset, batch_size=3):
    """fastpipe's batches of a torchvision dataset against torchvision's own DataLoader's, in levels: within
    one everywhere; and where the fused resize rounds to uint8 as torchvision's does (bicubic, nearest; the
    bilinear one keeps its float sums), equal but for a few values."""
    rounded = convert_transform(dataset.transform).interpolation != "bilinear"
    ours = list(fastpipe.Loader(dataset, batch_size=batch_size))
    theirs = list(torch.utils.data.DataLoader(dataset, batch_size=batch_size))
    std = torch.tensor(STD).view(1, 3, 1, 1) * 255
    for (x, y), (rx, ry) in zip(ours, theirs, strict=True):
        assert torch.equal(y, ry)
        assert x.shape == rx.shape and x.dtype == rx.dtype
        levels = ((x - rx) * std).abs()
        assert float(levels.max()) <= EXACT_TOL
        if rounded:
            assert float((levels > 0.5).float().mean()) < 0.02


@pytest.mark.parametrize("interpolation", [IM.BILINEAR, IM.BICUBIC])
@pytest.mark.parametrize("backend,v2", [("pil", False), ("pil", True), ("tensor", False), ("tensor", True)])
def test_eval_preset_matches_torchvision(root, interpolation, backend, v2):
    preset = EvalPreset(40, 46, interpolation, backend, v2)
    assert_matches_dataloader(tv.datasets.ImageFolder(root, preset))


@pytest.mark.parametrize("interpolation", [IM.BILINEAR, IM.BICUBIC, IM.NEAREST])
@pytest.mark.parametrize("backend", ["pil", "tensor"])
def test_weights_image_classification_matches_torchvision(root, interpolation, backend):
    """weights.transforms() (torchvision's ImageClassification), and the references' --backend tensor
    form of it: Compose([PILToTensor(), weights.transforms()])."""
    from torchvision.transforms._presets import ImageClassification

    preset = ImageClassification(crop_size=40, resize_size=47, interpolation=interpolation, mean=MEAN, std=STD)
    transform = preset if backend == "pil" else T1.Compose([T1.PILToTensor(), preset])
    assert_matches_dataloader(tv.datasets.ImageFolder(root, transform))


@pytest.mark.parametrize("interpolation", [IM.BILINEAR, IM.BICUBIC])
@pytest.mark.parametrize("backend,v2,resize_as", [("pil", False, "pil"), ("pil", True, "pil"),
                                                   ("tensor", False, "torch_float"), ("tensor", True, "torch_uint8")])
def test_train_preset_is_read_through(root, interpolation, backend, v2, resize_as):
    preset = TrainPreset(32, interpolation, backend, v2, erase=0.25)
    fused = convert_transform(preset)
    assert fused.interpolation == interpolation.value
    assert fused.resize_as == resize_as
    assert fused.mirror == 0.5 and fused.erase.p == 0.25 and fused.mean == list(MEAN)
    got = list(fastpipe.Loader(tv.datasets.ImageFolder(root, preset), batch_size=4, shuffle=True, seed=2))
    want = list(fastpipe.Loader(fastpipe.ImageFolder(root, transform=fused), batch_size=4, shuffle=True, seed=2))
    for (a, la), (b, lb) in zip(got, want, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_module_presets_and_nesting_are_read_through(root):
    fused = convert_transform(ModulePreset(EvalPreset(40, 46)))
    assert (fused.size, fused.resize) == ((40, 40), 46)


class DoesMore:
    def __init__(self):
        self.transforms = T1.Compose([T1.CenterCrop(8), T1.ToTensor()])

    def __call__(self, img):
        return self.transforms(img) * 2


class Logs:
    def __init__(self):
        self.transforms = T1.Compose([T1.CenterCrop(8), T1.ToTensor()])
        self.seen = 0

    def __call__(self, img):
        self.seen += 1
        return self.transforms(img)


def test_wrappers_that_may_do_more_are_refused_by_name(root):
    hooked = ModulePreset(T1.Compose([T1.CenterCrop(8), T1.ToTensor()]))
    hooked.register_forward_hook(lambda module, args, out: out)
    namespace = {"T1": T1}
    exec("class Unseen:\n    def __init__(self):\n        self.t = T1.Compose([T1.CenterCrop(8), T1.ToTensor()])\n"
         "    def __call__(self, img):\n        return self.t(img)\n", namespace)
    for wrapper, why in ((DoesMore(), r"fuse DoesMore into .*\(not a torchvision transform, and its __call__ does more"),
                         (Logs(), "Logs .*does more"), (hooked, "forward hooks"),
                         (namespace["Unseen"](), "source is not available")):
        with pytest.raises(ValueError, match=why):
            fastpipe.Loader(tv.datasets.ImageFolder(root, wrapper), batch_size=2)


def test_weight_presets_of_other_kinds_are_refused(root):
    from torchvision.transforms._presets import ObjectDetection

    with pytest.raises(ValueError, match="ObjectDetection"):
        fastpipe.Loader(tv.datasets.ImageFolder(root, ObjectDetection()), batch_size=2)


def test_to_pure_tensor_is_accepted_anywhere(root):
    for steps in ([T2.ToPureTensor(), T2.CenterCrop(20), T2.PILToTensor()],
                  [T2.CenterCrop(20), T2.ToImage(), T2.ToPureTensor(), T2.ToDtype(torch.float32, scale=True),
                   T2.RandomErasing(0.5), T2.ToPureTensor()]):
        assert convert_transform(T2.Compose(steps)).size == (20, 20)


# ---- collate_fn ---------------------------------------------------------------------------------


def test_default_collate_is_the_batch_as_it_is(root):
    ds = tv.datasets.ImageFolder(root, EvalPreset(24, 28))
    plain = [(x.clone(), y.clone()) for x, y in fastpipe.Loader(ds, batch_size=4)]
    for collate in (default_collate, collate_by_its_module_path):
        ld = fastpipe.Loader(ds, batch_size=4, collate_fn=collate)
        assert ld.collate_fn is None
        for (x, y), (px, py) in zip(ld, plain, strict=True):
            assert torch.equal(x, px) and torch.equal(y, py)


def test_a_collate_gets_the_samples_as_dataloader_hands_them_over(root):
    ds = tv.datasets.ImageFolder(root, EvalPreset(40, 46))  # shrinks of under 2x: no DCT scaling
    seen = []

    def collate(samples):
        seen.append(samples)
        return default_collate(samples)

    got = list(fastpipe.Loader(ds, batch_size=4, collate_fn=collate))
    want = list(torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=collate))
    ours, theirs = seen[:len(got)], seen[len(got):]
    assert [len(s) for s in ours] == [len(s) for s in theirs] == [4, 2]
    for a, b in zip(ours, theirs, strict=True):
        for (image, label), (ref_image, ref_label) in zip(a, b, strict=True):
            assert type(label) is type(ref_label) is int and label == ref_label
            assert image.shape == ref_image.shape and image.dtype == ref_image.dtype
    for (x, y), (rx, ry) in zip(got, want, strict=True):
        assert torch.equal(y, ry) and float((x - rx).abs().max()) < 0.05


@pytest.mark.parametrize("which", ["MixUp", "CutMix"])
def test_the_references_mixup_cutmix_collate(root, which):
    ds = tv.datasets.ImageFolder(root, TrainPreset(32))
    mix = getattr(T2, which)(alpha=1.0, num_classes=len(ds.classes))

    def collate_fn(batch):  # as the references write it
        return mix(*default_collate(batch))

    batches = list(fastpipe.Loader(ds, batch_size=4, shuffle=True, collate_fn=collate_fn))
    assert [tuple(x.shape) for x, _ in batches] == [(4, 3, 32, 32), (2, 3, 32, 32)]
    for x, y in batches:
        assert y.shape == (len(x), len(ds.classes)) and torch.allclose(y.sum(1), torch.ones(len(x)))


def test_collates_of_npy_records(tmp_path):
    x = np.arange(7 * 3, dtype=np.float32).reshape(7, 3)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.arange(7, dtype=np.int64))
    for spec, check in (
        (str(tmp_path / "x.npy"), lambda s: torch.equal(s, torch.from_numpy(x[0]))),
        ([str(tmp_path / "x.npy"), str(tmp_path / "y.npy")], lambda s: isinstance(s, tuple) and int(s[1]) == 0),
        ({"x": str(tmp_path / "x.npy")}, lambda s: torch.equal(s["x"], torch.from_numpy(x[0]))),
    ):
        first = next(iter(fastpipe.Loader(fastpipe.NpyDataset(spec), batch_size=3, collate_fn=lambda b: b)))
        assert len(first) == 3 and check(first[0])
    with pytest.raises(TypeError, match="collate_fn must be callable"):
        fastpipe.Loader(fastpipe.NpyDataset(str(tmp_path / "x.npy")), collate_fn="stack")


# ---- the sampler's epoch is the user's -----------------------------------------------------------


class RepeatedAugmentationSampler(torch.utils.data.Sampler):
    """Each sample `repeats` times per epoch, the copies spread over the ranks (DeiT's repeated
    augmentation, as the references' --ra-sampler uses it), shuffled per epoch."""

    def __init__(self, n, num_replicas, rank, repeats=3, seed=0):
        self.n, self.num_replicas, self.rank, self.repeats, self.seed = n, num_replicas, rank, repeats, seed
        self.epoch = 0
        self.per_rank = -(-n * repeats // num_replicas)

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = [i for i in torch.randperm(self.n, generator=g).tolist() for _ in range(self.repeats)]
        order += order[:self.per_rank * self.num_replicas - len(order)]
        return iter(order[self.rank::self.num_replicas])

    def __len__(self):
        return self.per_rank

    def set_epoch(self, epoch):
        self.epoch = epoch


@pytest.fixture
def indices(tmp_path):
    np.save(tmp_path / "i.npy", np.arange(29, dtype=np.int64))
    return fastpipe.NpyDataset(str(tmp_path / "i.npy"))


@pytest.mark.parametrize("make", [
    lambda n: DistributedSampler(range(n), num_replicas=2, rank=1, shuffle=True, seed=3),
    lambda n: RepeatedAugmentationSampler(n, num_replicas=2, rank=0, seed=5),
], ids=["distributed", "repeated-augmentation"])
def test_the_scripts_set_epoch_decides_the_order(indices, make):
    """A script resumed at epoch 5 calls sampler.set_epoch(5), 6, ...: each pass reads that epoch's order,
    the transforms' draws follow that epoch, and fastpipe never calls set_epoch behind the script's back."""
    sampler = make(len(indices))
    calls = []
    original = sampler.set_epoch
    sampler.set_epoch = lambda e: (calls.append(e), original(e))
    ld = fastpipe.Loader(indices, batch_size=4, sampler=sampler)
    reference = make(len(indices))

    def order_of(epoch):
        reference.set_epoch(epoch)
        return list(reference)

    for epoch in (5, 6, 9):
        sampler.set_epoch(epoch)
        assert [int(v) for batch in ld for v in batch] == order_of(epoch)
        assert ld.state_dict()["epoch"] == epoch + 1  # the pass drew as epoch `epoch`
    assert [int(v) for batch in ld for v in batch] == order_of(9)  # not told: the sampler's order stays
    assert ld.state_dict()["epoch"] == 10  # and so do the draws
    assert calls == [5, 6, 9]
    ld.set_epoch(2)  # the Loader's own set_epoch is forwarded
    assert calls == [5, 6, 9, 2]
    assert [int(v) for batch in ld for v in batch] == order_of(2)


def test_an_extra_pass_does_not_shift_the_epochs(indices):
    """Lightning iterates the loader once before training (to check it is iterable), then sets the
    sampler's epoch 0, 1, ...: each pass draws as the sampler's epoch, whatever passes came before; and
    a sampler never told its epoch repeats its order, as with DataLoader."""
    sampler = DistributedSampler(range(len(indices)), num_replicas=3, rank=2, shuffle=True, seed=1)
    ld = fastpipe.Loader(indices, batch_size=5, sampler=sampler)
    next(iter(ld))
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        it = iter(ld)
        next(it)
        assert ld.state_dict()["epoch"] == epoch
        assert [int(v) for v in next(it)] == list(sampler)[5:10]
    first, second = ([int(v) for b in ld for v in b] for _ in range(2))
    assert first == second == list(sampler)


def test_pin_memory_without_a_gpu_warns_once_per_process(indices, monkeypatch):
    if fastpipe.build_info()["cuda_available"]:
        pytest.skip("a usable CUDA device pins the batches")
    monkeypatch.setattr(_dataloader_args, "_warned_unpinned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            fastpipe.Loader(indices, batch_size=4, pin_memory=True)
    (warning,) = [w for w in caught if "pin_memory=True" in str(w.message)]
    assert warning.filename == __file__, "the warning names the line that made the Loader"



def test_an_epoch_set_between_iter_and_the_first_batch_counts(indices):
    """As with DataLoader, whose order is drawn at its first batch: Lightning calls iter() before it sets
    the epoch of the loader's sampler (loader.sampler stands for a Loader's own order)."""
    def order(epoch, skip=0, **kw):
        ld = fastpipe.Loader(indices, batch_size=4, shuffle=True, seed=3, **kw)
        ld.set_epoch(epoch)
        return [int(v) for batch in ld for v in batch][4 * skip:]

    ld = fastpipe.Loader(indices, batch_size=4, shuffle=True, seed=3)
    it = iter(ld)
    ld.sampler.set_epoch(7)
    assert ld.state_dict()["epoch"] == 7
    assert [int(v) for batch in it for v in batch] == order(7)
    # A resumed position survives an iter() and the set_epoch of its own epoch before the first batch.
    saved = fastpipe.Loader(indices, batch_size=4, shuffle=True, seed=3)
    saved.set_epoch(7)
    taken = iter(saved)
    next(taken), next(taken), next(taken)
    resumed = fastpipe.Loader(indices, batch_size=4, shuffle=True, seed=3)
    resumed.load_state_dict(saved.state_dict())
    it = iter(resumed)
    resumed.sampler.set_epoch(7)
    assert [int(v) for batch in it for v in batch] == order(7, skip=3)
    # A user's sampler told its epoch after iter().
    sampler = DistributedSampler(range(len(indices)), num_replicas=2, rank=0, shuffle=True, seed=1)
    ld = fastpipe.Loader(indices, batch_size=4, sampler=sampler)
    it = iter(ld)
    sampler.set_epoch(4)
    assert [int(v) for batch in it for v in batch] == list(sampler)
    # Once a batch is out, a new epoch ends the pass.
    it = iter(ld)
    next(it)
    ld.set_epoch(1)
    with pytest.raises(RuntimeError, match="superseded by set_epoch"):
        next(it)
