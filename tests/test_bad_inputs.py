"""A bad-input sweep of the public API: wrong types, out-of-range values, NaN/inf, empty and huge inputs.

Each case must raise the stated exception type (TypeError for a wrong type, ValueError for a wrong value)
with a message naming the argument: never a crash, a hang, a bare message from deep inside, or a silent
truncation. Abuse that must *work* (absurd but legal values) is at the end.
"""

import math
import re
import types

import numpy as np
import pytest
import torch
import torch.nn as nn

import fastpipe
from fastpipe.nn import FusedConv2d, fuse
from fastpipe.nn.functional import conv2d_act
from fastpipe.transforms import CenterCrop, CropMirrorNormalize, RandomResizedCrop

pytestmark = pytest.mark.torch_build

N = 12
NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad_inputs")
    rng = np.random.default_rng()
    np.save(d / "image.npy", rng.integers(0, 256, (N, 8, 8, 3), dtype=np.uint8))
    np.save(d / "label.npy", rng.integers(0, 10, N, dtype=np.int64))
    (d / "tokens.bin").write_bytes(rng.integers(0, 50000, 1001, dtype=np.uint16).tobytes())
    ds = fastpipe.NpyDataset({"image": str(d / "image.npy"), "label": str(d / "label.npy")})
    loader = fastpipe.Loader(ds, 4, timeout=30)
    from PIL import Image
    for k in range(2):
        (d / "jpegs" / "c").mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (9, 13, 3), dtype=np.uint8)).save(d / "jpegs" / "c" / f"{k}.jpg")
    (d / "empty").mkdir()
    jpeg = (d / "jpegs" / "c" / "0.jpg").read_bytes()
    yield types.SimpleNamespace(dir=d, ds=ds, tokens=str(d / "tokens.bin"), loader=loader,
                                x=torch.randn(2, 4, 9, 9), w=torch.randn(8, 4, 3, 3), jpeg=jpeg,
                                folder=fastpipe.ImageFolder(str(d / "jpegs"), cache_dir="off"))
    loader.close()


def loader(e, **kw):
    return fastpipe.Loader(e.ds, **{"batch_size": 4, **kw}).close()


def state(e, **changes):
    return e.loader.load_state_dict({**e.loader.state_dict(), **changes})


def write(e, dataset, **kw):
    return fastpipe.write_npy(dataset, e.dir / "written", **{"progress": False, **kw})


def images(e, **kw):
    return fastpipe.Loader(e.folder, **{"batch_size": 2, **kw}).close()


def write_jpegs(e, source, **kw):
    return fastpipe.write_images(source, e.dir / "packed", **{"progress": False, **kw})


def cmn(**kw):
    return CropMirrorNormalize(**{"mean": 0.5, "std": 0.25, **kw})


CASES = [
    # Loader: counts
    ("num_threads-huge", lambda e: loader(e, num_threads=10**6), ValueError, "num_threads must be at most 1024"),
    ("num_threads-negative", lambda e: loader(e, num_threads=-1), ValueError, "num_threads must be at least 0"),
    ("num_threads-float", lambda e: loader(e, num_threads=2.0), TypeError, "num_threads must be an int"),
    ("num_threads-str", lambda e: loader(e, num_threads="2"), TypeError, "num_threads must be an int"),
    ("num_threads-bool", lambda e: loader(e, num_threads=True), TypeError, "num_threads must be an int"),
    ("num_workers-negative", lambda e: loader(e, num_workers=-1), ValueError, "num_workers must be at least 0"),
    ("num_workers-str", lambda e: loader(e, num_workers="4"), TypeError, "num_workers must be an int"),
    ("batch_size-zero", lambda e: loader(e, batch_size=0), ValueError, "batch_size must be at least 1"),
    ("batch_size-float", lambda e: loader(e, batch_size=2.5), TypeError, "batch_size must be an int"),
    ("batch_size-str", lambda e: loader(e, batch_size="4"), TypeError, "batch_size must be an int"),
    ("batch_size-bool", lambda e: loader(e, batch_size=True), TypeError, "batch_size must be an int"),
    ("batch_size-none", lambda e: loader(e, batch_size=None), TypeError,
     r"batch_size=None \(DataLoader.s items one by one, unbatched\) is not supported"),
    ("batch_size-float-tensor", lambda e: loader(e, batch_size=torch.tensor(4.0)), TypeError,
     "batch_size must be an int, got Tensor"),
    ("batch_size-bool-tensor", lambda e: loader(e, batch_size=torch.tensor(True)), TypeError,
     "batch_size must be an int, got Tensor"),
    ("batch_size-beyond-memory", lambda e: loader(e, batch_size=10**12), ValueError,
     r"arena needs .* \(batch_size=1000000000000\), more than this machine's .* memory; lower batch_size"),
    ("batch_size-beyond-int64", lambda e: loader(e, batch_size=2**62), ValueError,
     "batch_size=4611686018427387904 is too large"),
    ("batch_size-beyond-c", lambda e: loader(e, batch_size=2**70), (ValueError, TypeError), "batch_size"),
    ("prefetch-zero", lambda e: loader(e, prefetch=0), ValueError, "prefetch must be at least 1"),
    ("prefetch-float", lambda e: loader(e, prefetch=1.5), TypeError, "prefetch must be an int"),
    ("prefetch-beyond-memory", lambda e: loader(e, prefetch=10**9), ValueError,
     r"arena needs 1000000002 slots \(prefetch=1000000000 \+ 2\)"),
    ("prefetch-beyond-c", lambda e: loader(e, prefetch=2**40), ValueError, "prefetch must be at most"),
    ("prefetch_factor-zero", lambda e: loader(e, prefetch_factor=0), ValueError, "prefetch_factor must be at least 1"),
    ("prefetch_factor-str", lambda e: loader(e, prefetch_factor="2"), TypeError, "prefetch_factor must be an int"),
    # Loader: seeds, flags, choices
    ("seed-float", lambda e: loader(e, seed=1.5), TypeError, "seed must be an int, got float 1.5"),
    ("seed-str", lambda e: loader(e, seed="x"), TypeError, "seed must be an int, got str 'x'"),
    ("seed-negative", lambda e: loader(e, seed=-1), ValueError, "seed must be at least 0"),
    ("seed-beyond-64-bits", lambda e: loader(e, seed=2**64), ValueError, "seed must be at most"),
    ("seed-nan", lambda e: loader(e, seed=NAN), TypeError, "seed must be an int"),
    ("generator-not-a-generator", lambda e: loader(e, generator=3), TypeError, "generator must be a torch.Generator"),
    ("shuffle-str", lambda e: loader(e, shuffle="yes"), TypeError, "shuffle must be True or False"),
    ("shuffle-2", lambda e: loader(e, shuffle=2), TypeError, "shuffle must be True or False"),
    ("drop_last-str", lambda e: loader(e, drop_last="no"), TypeError, "drop_last must be True or False"),
    ("pin_memory-str", lambda e: loader(e, pin_memory="cuda"), TypeError, "pin_memory must be True or False"),
    ("io-unknown", lambda e: loader(e, io="fast"), ValueError, "io must be one of"),
    ("io-not-str", lambda e: loader(e, io=1), TypeError, "io must be one of"),
    ("when_full-unknown", lambda e: loader(e, when_full="wait"), ValueError, "when_full must be one of"),
    ("shard_remainder-unknown", lambda e: loader(e, shard_remainder="wrap"), ValueError,
     "shard_remainder must be one of"),
    ("device-unknown", lambda e: loader(e, device="tpu"), ValueError, "device must be 'cpu', 'cuda'"),
    ("device-number", lambda e: loader(e, device=[0]), ValueError, "device must be 'cpu', 'cuda'"),
    ("timeout-negative", lambda e: loader(e, timeout=-1.0), ValueError, "timeout must be in"),
    ("timeout-nan", lambda e: loader(e, timeout=NAN), ValueError, "timeout must be a finite number"),
    ("timeout-str", lambda e: loader(e, timeout="10"), TypeError, "timeout must be a number"),
    ("rank-out-of-range", lambda e: loader(e, rank=2, world_size=2), ValueError,
     r"rank must be at most 1 \(world_size=2\)"),
    ("rank-float", lambda e: loader(e, rank=0.0, world_size=2), TypeError, "rank must be an int"),
    ("world_size-zero", lambda e: loader(e, world_size=0), ValueError, "world_size must be at least 1"),
    ("sampler-not-iterable", lambda e: loader(e, sampler=5), TypeError, "sampler must be an iterable"),
    ("sampler-out-of-range", lambda e: list(fastpipe.Loader(e.ds, 4, sampler=[0, N])), ValueError,
     f"sampler yielded index {N}, out of range"),
    ("transforms-list", lambda e: loader(e, transforms=[cmn()]), TypeError, "transforms must be a dict"),
    ("transforms-unknown-field", lambda e: loader(e, transforms={"nope": cmn()}), KeyError, "'nope' is not a field"),
    ("dataset-tensor", lambda e: fastpipe.Loader(torch.zeros(4, 2), 2), TypeError, "NpyDataset, TokenDataset, ImageFolder, ImageDataset and WebDataset"),
    ("dataset-path", lambda e: fastpipe.Loader(str(e.dir / "image.npy"), 2), TypeError, "write_npy"),
    # Loader: epochs and positions
    ("set_epoch-float", lambda e: e.loader.set_epoch(1.5), TypeError, "epoch must be an int"),
    ("set_epoch-float-tensor", lambda e: e.loader.set_epoch(torch.tensor(2.0)), TypeError,
     "epoch must be an int, got Tensor"),
    ("set_epoch-bool-tensor", lambda e: e.loader.set_epoch(torch.tensor(True)), TypeError,
     "epoch must be an int, got Tensor"),
    ("set_epoch-negative", lambda e: e.loader.set_epoch(-1), ValueError, "epoch must be at least 0"),
    ("timeout-attribute-inf-str", lambda e: setattr(e.loader, "timeout", "inf"), TypeError,
     "timeout must be a number"),
    ("state-none", lambda e: e.loader.load_state_dict(None), TypeError, "state must be a dict"),
    ("state-list", lambda e: e.loader.load_state_dict([1]), TypeError, "state must be a dict"),
    ("state-epoch-float", lambda e: state(e, epoch=3.5), TypeError, r"state\['epoch'\] must be an int"),
    ("state-batch-float", lambda e: state(e, batch=1.5), TypeError, r"state\['batch'\] must be an int"),
    ("state-epoch-bool", lambda e: state(e, epoch=True), TypeError, r"state\['epoch'\] must be an int"),
    ("state-batch-none", lambda e: state(e, batch=None), TypeError, r"state\['batch'\] must be an int"),
    ("state-batch-negative", lambda e: state(e, batch=-2), ValueError, r"state\['batch'\] must be at least 0"),
    ("state-batch-huge", lambda e: state(e, batch=10**30), ValueError, "out of range"),
    ("state-other-seed", lambda e: state(e, seed=99), ValueError, "saved with seed=99"),
    # NpyDataset, TokenDataset
    ("npy-columns-int", lambda e: fastpipe.NpyDataset(5), TypeError, "columns must be a path"),
    ("npy-columns-empty", lambda e: fastpipe.NpyDataset([]), ValueError, "at least one column"),
    ("npy-column-none", lambda e: fastpipe.NpyDataset({"a": None}), TypeError, r"columns\['a'\] must be a path"),
    ("npy-missing-file", lambda e: fastpipe.NpyDataset(str(e.dir / "absent.npy")), FileNotFoundError, "absent.npy"),
    ("npy-directory", lambda e: fastpipe.NpyDataset(str(e.dir)), IsADirectoryError, "bad_inputs.*Is a directory"),
    ("npy-index-out-of-range", lambda e: e.ds[N], IndexError, str(N)),
    ("npy-index-float", lambda e: e.ds[1.5], TypeError, "index"),
    ("tokens-path-none", lambda e: fastpipe.TokenDataset(None, 8), TypeError, "path must be a path"),
    ("tokens-block_size-zero", lambda e: fastpipe.TokenDataset(e.tokens, 0), ValueError,
     "block_size must be at least 1"),
    ("tokens-block_size-float", lambda e: fastpipe.TokenDataset(e.tokens, 8.0), TypeError,
     "block_size must be an int"),
    ("tokens-block_size-huge", lambda e: fastpipe.TokenDataset(e.tokens, 10**18), ValueError,
     "fewer than one window of block_size"),
    ("tokens-dtype-float", lambda e: fastpipe.TokenDataset(e.tokens, 8, dtype="float32"), ValueError,
     "dtype must be one of"),
    ("tokens-dtype-numpy", lambda e: fastpipe.TokenDataset(e.tokens, 8, dtype=np.uint16), TypeError,
     "dtype must be one of"),
    ("tokens-odd-size", lambda e: fastpipe.TokenDataset(e.tokens, 8, dtype="int32"), ValueError,
     "not a whole number of int32 tokens"),
    # write_npy
    ("write-dataset-str", lambda e: write(e, "abc"), TypeError, "dataset must be a map-style dataset"),
    ("write-dataset-int", lambda e: write(e, 5), TypeError, "dataset must be a map-style dataset"),
    ("write-dataset-empty", lambda e: write(e, []), ValueError, "the dataset is empty"),
    ("write-out_dir-int", lambda e: fastpipe.write_npy([np.zeros(3)], 5), TypeError, "out_dir must be a path"),
    ("write-chunk_size-zero", lambda e: write(e, [np.zeros(3)], chunk_size=0), ValueError,
     "chunk_size must be at least 1"),
    ("write-chunk_size-float", lambda e: write(e, [np.zeros(3)], chunk_size=1.5), TypeError,
     "chunk_size must be an int"),
    ("write-progress-str", lambda e: write(e, [np.zeros(3)], progress="no"), TypeError,
     "progress must be True or False"),
    ("write-item-str", lambda e: write(e, ["abc"]), TypeError, "item 0"),
    ("write-item-object", lambda e: write(e, [object()]), TypeError, "item 0"),
    ("write-shape-changes", lambda e: write(e, [np.zeros(3), np.zeros(4)]), ValueError, "item 1"),
    # CropMirrorNormalize
    ("cmn-mean-str", lambda e: cmn(mean="abc"), TypeError, "mean must be a number or a sequence"),
    ("cmn-mean-empty", lambda e: cmn(mean=[]), ValueError, "mean must not be empty"),
    ("cmn-mean-nan", lambda e: cmn(mean=[0.5, NAN, 0.5]), ValueError, r"mean\[1\] must be a finite number"),
    ("cmn-mean-inf", lambda e: cmn(mean=INF), ValueError, r"mean\[0\] must be a finite number"),
    ("cmn-mean-none", lambda e: cmn(mean=None), TypeError, "mean must be a number or a sequence"),
    ("cmn-std-zero", lambda e: cmn(std=[0.2, 0.0, 0.2]), ValueError, r"std\[1\] must be positive"),
    ("cmn-std-negative", lambda e: cmn(std=-1), ValueError, r"std\[0\] must be positive"),
    ("cmn-std-nan", lambda e: cmn(std=NAN), ValueError, r"std\[0\] must be a finite number"),
    ("cmn-std-str-item", lambda e: cmn(std=[0.2, "x"]), TypeError, r"std\[1\] must be a number"),
    ("cmn-crop-int", lambda e: cmn(crop=5), TypeError, "crop must be None or"),
    ("cmn-crop-one", lambda e: cmn(crop=(3,)), TypeError, "crop must be None or"),
    ("cmn-crop-zero", lambda e: cmn(crop=(0, 4)), ValueError, "crop height must be at least 1"),
    ("cmn-crop-float", lambda e: cmn(crop=(4, 4.5)), TypeError, "crop width must be an int"),
    ("cmn-crop-too-big", lambda e: loader(e, transforms={"image": cmn(crop=(9, 4))}), ValueError,
     "the crop 9x4 does not fit in images of 8x8"),
    ("cmn-mirror-above-one", lambda e: cmn(mirror=1.5), ValueError, r"mirror must be in \[0.0, 1.0\]"),
    ("cmn-mirror-nan", lambda e: cmn(mirror=NAN), ValueError, "mirror must be a finite number"),
    ("cmn-mirror-bool", lambda e: cmn(mirror=True), TypeError, "mirror must be a number"),
    ("cmn-random_crop-str", lambda e: cmn(random_crop="yes"), TypeError, "random_crop must be True or False"),
    ("cmn-out_dtype-int", lambda e: cmn(out_dtype=torch.int8), ValueError, "out_dtype must be one of"),
    ("cmn-layout", lambda e: cmn(layout="nchw"), ValueError, "layout must be"),
    ("cmn-in_layout", lambda e: cmn(in_layout="NHWC"), ValueError, "in_layout must be"),
    ("cmn-channels-mismatch", lambda e: loader(e, transforms={"image": cmn(mean=[0.1, 0.2])}), ValueError,
     "3 channels but mean has 2 values"),
    ("cmn-label-column", lambda e: loader(e, transforms={"label": cmn()}), TypeError, "takes uint8 images"),
    # RandomResizedCrop, CenterCrop
    ("rrc-size-zero", lambda e: RandomResizedCrop(0), ValueError, "size must be at least 1"),
    ("rrc-size-float", lambda e: RandomResizedCrop(2.5), TypeError, "size must be an int"),
    ("rrc-size-triple", lambda e: RandomResizedCrop((1, 2, 3)), ValueError, r"size must be an int or \(height"),
    ("rrc-size-pair-zero", lambda e: RandomResizedCrop((4, 0)), ValueError, r"size\[1\] must be at least 1"),
    ("rrc-scale-reversed", lambda e: RandomResizedCrop(8, scale=(0.9, 0.1)), ValueError,
     r"scale must be \(min, max\) with min <= max"),
    ("rrc-scale-nan", lambda e: RandomResizedCrop(8, scale=(NAN, 1.0)), ValueError, r"scale\[0\] must be a finite"),
    ("rrc-scale-zero", lambda e: RandomResizedCrop(8, scale=(0, 1.0)), ValueError, r"scale\[0\] must be positive"),
    ("rrc-scale-str", lambda e: RandomResizedCrop(8, scale="big"), TypeError, r"scale must be a \(min, max\) pair"),
    ("rrc-ratio-negative", lambda e: RandomResizedCrop(8, ratio=(-1, 2)), ValueError, r"ratio\[0\] must be positive"),
    ("rrc-mirror-two", lambda e: RandomResizedCrop(8, mirror=2), ValueError, r"mirror must be in \[0.0, 1.0\]"),
    ("rrc-out_dtype-int32", lambda e: RandomResizedCrop(8, out_dtype=torch.int32), ValueError, "out_dtype must be one of"),
    ("rrc-mean-without-std", lambda e: RandomResizedCrop(8, mean=0.5), ValueError, "give both mean and std"),
    ("rrc-mean-uint8", lambda e: RandomResizedCrop(8, mean=0.5, std=0.2, out_dtype=torch.uint8), ValueError,
     "out_dtype=torch.uint8 keeps pixel values"),
    ("rrc-mean-two", lambda e: RandomResizedCrop(8, mean=[0.1, 0.2], std=0.2), ValueError, "mean needs 1 or 3 values"),
    ("rrc-std-zero", lambda e: RandomResizedCrop(8, mean=0.1, std=0), ValueError, r"std\[0\] must be positive"),
    ("rrc-layout", lambda e: RandomResizedCrop(8, layout="CHW"), ValueError, "layout must be one of"),
    ("rrc-dct_scaling-str", lambda e: RandomResizedCrop(8, dct_scaling="yes"), TypeError,
     "dct_scaling must be True or False"),
    ("cc-resize-zero", lambda e: CenterCrop(8, resize=0), ValueError, "resize must be at least 1"),
    ("cc-resize-float", lambda e: CenterCrop(8, resize=2.5), TypeError, "resize must be an int"),
    ("cc-resize-pair-zero", lambda e: CenterCrop(8, resize=(0, 3)), ValueError, r"resize\[0\] must be at least 1"),
    # ImageFolder, ImageDataset, write_images, and a Loader of images
    ("folder-missing", lambda e: fastpipe.ImageFolder(str(e.dir / "nope")), FileNotFoundError, "is not a directory"),
    ("folder-root-int", lambda e: fastpipe.ImageFolder(5), TypeError, "root must be a path"),
    ("folder-no-classes", lambda e: fastpipe.ImageFolder(str(e.dir / "empty"), cache_dir="off"), FileNotFoundError,
     "no class folder"),
    ("folder-transform-cmn", lambda e: fastpipe.ImageFolder(str(e.dir / "jpegs"), transform=cmn(), cache_dir="off"),
     TypeError, "transform must be fastpipe.transforms.RandomResizedCrop, CenterCrop or RandomCrop"),
    ("folder-max_record_bytes-zero", lambda e: fastpipe.ImageFolder(str(e.dir / "jpegs"), max_record_bytes=0),
     ValueError, "max_record_bytes must be at least 1"),
    ("folder-num_threads-zero", lambda e: fastpipe.ImageFolder(str(e.dir / "jpegs"), num_threads=0), ValueError,
     "num_threads must be at least 1"),
    ("folder-rescan-str", lambda e: fastpipe.ImageFolder(str(e.dir / "jpegs"), rescan="no"), TypeError,
     "rescan must be True or False"),
    ("dataset-not-packed", lambda e: fastpipe.ImageDataset(str(e.dir)), FileNotFoundError, "holds no meta.json"),
    ("webdataset-urls-int", lambda e: fastpipe.WebDataset(5), TypeError, "urls must be a path or URL"),
    ("webdataset-urls-empty", lambda e: fastpipe.WebDataset([]), TypeError, "urls must be a path or URL"),
    ("webdataset-missing", lambda e: fastpipe.WebDataset(str(e.dir / "s-{0..1}.tar")), FileNotFoundError,
     "2 of 2 shards do not exist"),
    ("webdataset-not-tar", lambda e: fastpipe.WebDataset(str(e.dir / "jpegs" / "c" / "0.jpg")), ValueError, "is not a valid tar archive"),
    ("webdataset-remote", lambda e: fastpipe.WebDataset("gs://bucket/s.tar"), ValueError, "only s3://, http:// and https:// URLs"),
    ("webdataset-brace", lambda e: fastpipe.WebDataset(str(e.dir / "s-{0..1.tar")), ValueError, "unbalanced brace"),
    ("webdataset-label-empty", lambda e: fastpipe.WebDataset(str(e.dir), label=""), ValueError, "label must be"),
    ("webdataset-threads", lambda e: fastpipe.WebDataset(str(e.dir), num_threads=0), ValueError,
     "num_threads must be at least 1"),
    ("write_images-source-int", lambda e: write_jpegs(e, 5), TypeError, "source must be an image folder's path"),
    ("write_images-empty", lambda e: write_jpegs(e, []), ValueError, "the source is empty"),
    ("folder-samples-empty", lambda e: fastpipe.ImageFolder(samples=[]), ValueError, "samples must be a non-empty list"),
    ("folder-samples-not-pairs", lambda e: fastpipe.ImageFolder(samples=["a.jpg"]), TypeError,
     r"samples must be a list of \(path, class_index\) pairs"),
    ("folder-samples-negative-class", lambda e: fastpipe.ImageFolder(samples=[("a.jpg", -1)]), ValueError,
     "class indices must be non-negative ints"),
    ("folder-neither-root-nor-samples", lambda e: fastpipe.ImageFolder(), TypeError, "needs root"),
    ("write_images-label-float", lambda e: write_jpegs(e, [(e.jpeg, 1.5)]), TypeError, "the label must be an int"),
    ("write_images-label-none", lambda e: write_jpegs(e, [(e.jpeg, None)]), TypeError, "the label must be an int"),
    ("write_images-decoded-array", lambda e: write_jpegs(e, [(np.zeros((2, 2, 3), np.uint8), 0)]), TypeError,
     "the image must be its encoded bytes"),
    ("write_images-item-not-pair", lambda e: write_jpegs(e, [e.jpeg]), TypeError,
     r"item 0 must be \(encoded bytes or path, label\)"),
    ("images-on_error", lambda e: images(e, transforms={0: CenterCrop(4)}, on_error="skip"), ValueError,
     "on_error must be one of"),
    ("images-no-transform", lambda e: images(e), ValueError, "needs a transform that makes every image the same size"),
    ("images-label-field", lambda e: images(e, transforms={1: CenterCrop(4)}), KeyError, "is not the image field"),
    ("images-cmn", lambda e: images(e, transforms={0: cmn()}), TypeError,
     "must be fastpipe.transforms.RandomResizedCrop, CenterCrop or RandomCrop"),
    # FusedConv2d
    ("fused-activation-unknown", lambda e: FusedConv2d(4, 8, 3, activation="swish"), ValueError,
     "activation must be one of"),
    ("fused-activation-module", lambda e: FusedConv2d(4, 8, 3, activation=nn.ELU()), ValueError,
     "activation module ELU is not supported"),
    ("fused-activation-int", lambda e: FusedConv2d(4, 8, 3, activation=3), TypeError, "activation must be a name"),
    ("fused-activation-kwarg", lambda e: FusedConv2d(4, 8, 3, activation="relu", negative_slope=0.1), TypeError,
     "takes no keyword argument negative_slope"),
    ("fused-negative_slope-str", lambda e: FusedConv2d(4, 8, 3, activation="leaky_relu", negative_slope="x"),
     TypeError, "negative_slope must be a number"),
    ("fused-negative_slope-nan", lambda e: FusedConv2d(4, 8, 3, activation="leaky_relu", negative_slope=NAN),
     ValueError, "negative_slope must be a finite number"),
    ("fused-hardtanh-reversed", lambda e: FusedConv2d(4, 8, 3, activation="hardtanh", min_val=1.0, max_val=-1.0),
     ValueError, "max_val"),
    ("fused-approximate", lambda e: FusedConv2d(4, 8, 3, activation="gelu", approximate="fast"), ValueError,
     "approximate must be"),
    ("fused-in_channels-zero", lambda e: FusedConv2d(0, 8, 3), ValueError, "in_channels must be at least 1"),
    ("fused-stride-zero", lambda e: FusedConv2d(4, 8, 3, stride=0), ValueError, "stride must be at least 1"),
    ("fused-padding-negative", lambda e: FusedConv2d(4, 8, 3, padding=-1), ValueError, "padding must be at least 0"),
    ("fused-dilation-zero", lambda e: FusedConv2d(4, 8, 3, dilation=(1, 0)), ValueError,
     "dilation must be at least 1"),
    ("fused-kernel-zero", lambda e: FusedConv2d(4, 8, 0), ValueError, "kernel_size must be at least 1"),
    ("fused-groups", lambda e: FusedConv2d(4, 8, 3, groups=3), ValueError, "groups"),
    ("fused-input-2d", lambda e: FusedConv2d(4, 8, 3)(torch.randn(4, 9)), (ValueError, RuntimeError), "input"),
    ("fused-input-channels", lambda e: FusedConv2d(4, 8, 3)(torch.randn(2, 5, 9, 9)), (ValueError, RuntimeError),
     "input"),
    ("fused-input-dtype", lambda e: FusedConv2d(4, 8, 3)(torch.randn(2, 4, 9, 9, dtype=torch.float64)),
     (ValueError, RuntimeError), "dtype"),
    ("fused-input-int", lambda e: FusedConv2d(4, 8, 3)(torch.ones(2, 4, 9, 9, dtype=torch.int32)),
     (ValueError, RuntimeError), "dtype"),
    ("fused-input-list", lambda e: FusedConv2d(4, 8, 3)([1.0]), TypeError, "input"),
    ("fused-input-too-small", lambda e: FusedConv2d(4, 8, 3)(torch.randn(2, 4, 2, 2)), (ValueError, RuntimeError),
     "input"),
    ("fused-residual-shape", lambda e: FusedConv2d(4, 8, 3)(e.x, torch.randn(2, 3, 7, 7)), ValueError,
     "residual of shape"),
    ("fused-residual-dtype", lambda e: FusedConv2d(4, 8, 3)(e.x, torch.randn(2, 8, 7, 7, dtype=torch.float64)),
     (ValueError, RuntimeError), "residual"),
    # conv2d_act
    ("conv-input-list", lambda e: conv2d_act([1.0], e.w), TypeError, "input"),
    ("conv-weight-3d", lambda e: conv2d_act(e.x, e.w[0]), (ValueError, RuntimeError), "weight"),
    ("conv-bias-size", lambda e: conv2d_act(e.x, e.w, torch.zeros(7)), (ValueError, RuntimeError), "bias"),
    ("conv-bias-dtype", lambda e: conv2d_act(e.x, e.w, torch.zeros(8, dtype=torch.float64)),
     (ValueError, RuntimeError), "bias"),
    ("conv-stride-one", lambda e: conv2d_act(e.x, e.w, stride=(1,)), ValueError, "stride must be an int or a pair"),
    ("conv-stride-zero", lambda e: conv2d_act(e.x, e.w, stride=0), ValueError, "stride"),
    ("conv-stride-float", lambda e: conv2d_act(e.x, e.w, stride=1.5), (TypeError, ValueError), "stride"),
    ("conv-padding-word", lambda e: conv2d_act(e.x, e.w, padding="full"), ValueError, "padding must be"),
    ("conv-padding-negative", lambda e: conv2d_act(e.x, e.w, padding=-1), ValueError, "padding"),
    ("conv-dilation-zero", lambda e: conv2d_act(e.x, e.w, dilation=0), ValueError, "dilation"),
    ("conv-groups-zero", lambda e: conv2d_act(e.x, e.w, groups=0), ValueError, "groups"),
    ("conv-groups-mismatch", lambda e: conv2d_act(e.x, e.w, groups=2), (ValueError, RuntimeError), "groups"),
    ("conv-activation", lambda e: conv2d_act(e.x, e.w, activation="mish"), ValueError, "activation must be one of"),
    ("conv-residual-shape", lambda e: conv2d_act(e.x, e.w, residual=torch.zeros(3)), ValueError, "residual of shape"),
    ("conv-residual-device", lambda e: conv2d_act(e.x, e.w, residual=torch.zeros(2, 8, 7, 7, device="meta")),
     (ValueError, RuntimeError), "residual"),
    ("conv-weight-device", lambda e: conv2d_act(e.x, e.w.to("meta")), (ValueError, RuntimeError), "weight"),
    # fuse
    ("fuse-model-str", lambda e: fuse("resnet18"), TypeError, "model must be an nn.Module"),
    ("fuse-model-none", lambda e: fuse(None), TypeError, "model must be an nn.Module"),
    ("fuse-inplace-str", lambda e: fuse(nn.Conv2d(4, 8, 3), inplace="yes"), TypeError,
     "inplace must be True or False"),
    ("fuse-example_inputs-int", lambda e: fuse(nn.Conv2d(4, 8, 3), example_inputs=5), TypeError,
     "example_inputs must be a tuple"),
    ("fuse-example_inputs-wrong-shape", lambda e: fuse(nn.Sequential(nn.Conv2d(4, 8, 3), nn.ReLU()),
                                                        example_inputs=(torch.randn(1, 3, 8, 8),)),
     (ValueError, RuntimeError), "example_inputs"),
]


@pytest.mark.parametrize("call,error,pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_naming_the_argument(env, call, error, pattern):
    with pytest.raises(error) as info:
        call(env)
    message = str(info.value)
    assert re.search(pattern, message), f"{info.type.__name__}: {message!r} does not match {pattern!r}"
    assert "[/" not in message or isinstance(info.value, OSError), f"a source location leaked: {message}"


def test_the_loader_of_the_sweep_still_works(env, fp):
    """No refused call above may have changed the loader it was made on."""
    env.loader.set_epoch(0)
    batches = list(env.loader)
    assert sum(len(b["label"]) for b in batches) == N
    labels = np.load(env.dir / "label.npy")
    assert np.array_equal(np.concatenate([b["label"].numpy() for b in batches]), labels)


def test_absurd_but_legal_values_work(env, fp):
    """batch_size beyond the dataset (one short batch), the most threads allowed, timeout inf (forever),
    numpy integers and bools where Python ones go, a token file one window long."""
    images = np.load(env.dir / "image.npy")
    with fastpipe.Loader(env.ds, N * 1000) as ld:
        (batch,) = list(ld)
        assert batch["image"].numpy().tobytes() == images.tobytes()
    threads = fp.count_threads()
    with fastpipe.Loader(env.ds, 5, num_threads=1024, timeout=INF, shuffle=np.bool_(True), seed=np.int64(3)) as ld:
        assert ld.timeout is None and ld.stats()["num_threads"] == 1024
        got = np.concatenate([b["label"].numpy() for b in ld])
        assert sorted(got.tolist()) == sorted(np.load(env.dir / "label.npy").tolist())
    assert fp.wait_until(lambda: fp.count_threads() <= threads), "reader threads left after close"
    tokens = fastpipe.TokenDataset(env.tokens, 999)  # 1001 tokens: one window of 1000, one token spare
    assert len(tokens) == 1
    ref = np.fromfile(env.tokens, dtype=np.uint16).astype(np.int64)
    (x, y), = list(fastpipe.Loader(tokens, 1))
    assert np.array_equal(x[0].numpy(), ref[:999]) and np.array_equal(y[0].numpy(), ref[1:1000])


def test_zero_size_batch_and_noncontiguous_residual_match_eager():
    """Legal corner inputs of the fused op compute what eager PyTorch computes."""
    w, b = torch.randn(8, 4, 3, 3, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    empty = torch.randn(0, 4, 9, 9, dtype=torch.float64)
    out = conv2d_act(empty, w, b, activation="relu")
    assert out.shape == (0, 8, 7, 7)
    x = torch.randn(2, 4, 9, 9, dtype=torch.float64)
    residual = torch.randn(2, 7, 7, 8, dtype=torch.float64).permute(0, 3, 1, 2)  # non-contiguous
    assert not residual.is_contiguous()
    ref = torch.relu(torch.nn.functional.conv2d(x, w, b) + residual)
    torch.testing.assert_close(conv2d_act(x, w, b, residual=residual), ref)
    assert not math.isnan(float(ref.sum()))


THREAD_START_FAILS = r"""
import os, resource, sys, time
import numpy as np
import fastpipe

np.save(sys.argv[1], np.arange(400, dtype=np.int64).reshape(100, 4))
ds = fastpipe.NpyDataset(sys.argv[1])
threads = len(os.listdir("/proc/self/task"))
# Room for the arena but not for 64 thread stacks (8 MiB each): a thread start fails part-way.
vm = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
resource.setrlimit(resource.RLIMIT_AS, (vm + 64 * 2**20, resource.RLIM_INFINITY))
try:
    fastpipe.Loader(ds, 4, num_threads=64)
    print("no error")
except OSError as e:
    print("error:", e)
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
# A joined thread leaves /proc/self/task a moment after pthread_join returns: poll, bounded (a leak stays).
deadline = time.monotonic() + 20
while len(os.listdir("/proc/self/task")) != threads and time.monotonic() < deadline:
    time.sleep(0.01)
print("threads left:", len(os.listdir("/proc/self/task")) - threads)
with fastpipe.Loader(ds, 4, num_threads=4) as ld:
    print("records after:", sum(len(b) for b in ld))
"""


def test_a_failed_thread_start_unwinds_into_an_exception(tmp_path, fp):
    """A reader thread that cannot start (here: no address space for its stack) used to abort the whole
    interpreter, as the threads already started were destroyed while joinable."""
    r = fp.run_python(THREAD_START_FAILS, args=(tmp_path / "x.npy",))
    assert r.returncode == 0, f"the process died ({r.returncode}):\n{r.stdout}\n{r.stderr[-3000:]}"
    lines = r.stdout.splitlines()
    assert re.match(r"error: \[Errno \d+\] could not start reader thread \d+ of num_threads=64: .*lower num_threads",
                    lines[0]), r.stdout
    assert lines[1:] == ["threads left: 0", "records after: 100"], r.stdout
