"""Training a ResNet on CIFAR-like .npy data with fastpipe.Loader: the one-line switch from DataLoader.

The training loop is a stock PyTorch one (DDP, SGD, bf16 autocast on GPU). Only the loader line changes:

    loader = DataLoader(dataset, batch_size=B, shuffle=True, drop_last=True, num_workers=W, pin_memory=True)
    loader = fastpipe.Loader(fastpipe.NpyDataset(files), batch_size=B, shuffle=True, drop_last=True,
                             num_workers=W, pin_memory=True)

and the normalisation moves into the loader (CropMirrorNormalize: on a CUDA loader it runs on the GPU, so
uint8 images cross PCIe). Under torchrun the Loader shards by rank on its own (no DistributedSampler), and
its ``state_dict()`` saved in the checkpoint makes ``--resume`` continue with exactly the remaining batches.

    python examples/train.py --data /tmp/cifar_npy            # generates the data when it is missing
    torchrun --nproc_per_node=2 examples/train.py --data /tmp/cifar_npy --save ckpt.pt --steps 50
    torchrun --nproc_per_node=2 examples/train.py --data /tmp/cifar_npy --resume ckpt.pt
    python examples/train.py --data /tmp/cifar_npy --loader torch   # the stock DataLoader, to compare

DDP uses gloo on CPU and nccl on GPU; rank 0 prints the loss and the images/s of all ranks together.
"""

import argparse
import itertools
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import fastpipe
from fastpipe.transforms import CropMirrorNormalize

MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)
COLUMNS = ("image", "label", "index")


def make_data(directory, n, seed):
    """CIFAR-like columns: uint8 images [n, 3, 32, 32] with a per-class pattern (so the loss falls),
    int64 labels, and each record's index (to check which records each rank saw)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n, dtype=np.int64)
    patterns = rng.integers(0, 256, (10, 3, 32, 32), dtype=np.uint8)
    noise = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
    images = (patterns[labels] // 2 + noise // 2).astype(np.uint8)
    os.makedirs(directory, exist_ok=True)
    for name, array in (("image", images), ("label", labels), ("index", np.arange(n, dtype=np.int64))):
        tmp = os.path.join(directory, f"{name}.partial.npy")
        np.save(tmp, array)
        os.replace(tmp, os.path.join(directory, f"{name}.npy"))  # an interrupted run leaves no half file


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.skip(x))


def make_model(name):
    if name == "resnet18":
        import torchvision

        model = torchvision.models.resnet18(num_classes=10)
        # CIFAR's 32x32 images: a 3x3 stem without the max pool, as CIFAR ResNets do.
        model.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        model.maxpool = nn.Identity()
        return model
    return nn.Sequential(  # "small": fast enough to run a few steps on a CPU in seconds
        nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


class NpyColumns(torch.utils.data.Dataset):
    """The same files as a map-style dataset, for the stock DataLoader."""

    def __init__(self, files):
        self.files = files
        self.arrays = None  # opened lazily: in each worker process, not pickled into it
        self.n = len(np.load(files["label"], mmap_mode="r"))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.arrays is None:
            self.arrays = {k: np.load(p, mmap_mode="r") for k, p in self.files.items()}
        return {k: torch.from_numpy(np.array(a[i])) for k, a in self.arrays.items()}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="data/cifar_npy", help="directory of image.npy, label.npy, index.npy")
    p.add_argument("--num-samples", type=int, default=10_000, help="records to generate when --data has none")
    p.add_argument("--model", choices=("small", "resnet18"), default="small")
    p.add_argument("--loader", choices=("fastpipe", "torch"), default="fastpipe")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps", type=int, default=None, help="at most this many steps per epoch (in this run)")
    p.add_argument("--batch-size", type=int, default=128, help="per rank")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--save", metavar="CKPT", help="save model, optimizer and loader position at the end")
    p.add_argument("--resume", metavar="CKPT", help="continue exactly where a --save run stopped")
    p.add_argument("--log-indices", metavar="FILE",
                   help="each rank writes FILE.rank<r>: one JSON line per step with the records it saw")
    p.add_argument("--print-every", type=int, default=20)
    args = p.parse_args()
    if args.loader == "torch" and (args.save or args.resume):
        p.error("--save/--resume need --loader fastpipe: the stock DataLoader has no state_dict to resume from")
    return args


def main():
    args = parse_args()
    distributed = "RANK" in os.environ  # set by torchrun
    on_gpu = args.device.startswith("cuda")
    if distributed:
        dist.init_process_group("nccl" if on_gpu else "gloo")
        if on_gpu:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    device = torch.device(f"cuda:{torch.cuda.current_device()}" if on_gpu else "cpu")

    files = {k: os.path.join(args.data, f"{k}.npy") for k in COLUMNS}
    if rank == 0 and not (os.path.exists(files["image"]) and os.path.exists(files["label"])):
        print(f"generating {args.num_samples} records under {args.data}")
        make_data(args.data, args.num_samples, args.seed)
    elif rank == 0 and not os.path.exists(files["index"]):  # your own data: only the index is added
        np.save(files["index"], np.arange(len(np.load(files["label"], mmap_mode="r")), dtype=np.int64))
    if distributed:
        dist.barrier()  # the other ranks wait for the data rank 0 writes

    gpu_loader = on_gpu and fastpipe.build_info()["cuda"]
    if args.loader == "fastpipe":
        # Normalised as it is read; a CUDA loader does it on the GPU, as bf16 channels_last for autocast.
        normalize = CropMirrorNormalize(MEAN, STD, mirror=0.5, in_layout="CHW",
                                        out_dtype=torch.bfloat16 if gpu_loader else torch.float32,
                                        layout="NHWC" if gpu_loader else "NCHW")
        # Was: DataLoader(dataset, batch_size=..., shuffle=True, drop_last=True, num_workers=...,
        #                 pin_memory=..., sampler=DistributedSampler(dataset)) + normalisation in the loop.
        loader = fastpipe.Loader(fastpipe.NpyDataset(files), batch_size=args.batch_size, shuffle=True,
                                 drop_last=True, num_workers=args.workers, pin_memory=on_gpu, seed=args.seed,
                                 device=device if gpu_loader else "cpu", transforms={"image": normalize})
    else:
        dataset = NpyColumns(files)
        sampler = torch.utils.data.DistributedSampler(dataset, world, rank, shuffle=True, seed=args.seed)
        loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                                             num_workers=args.workers, pin_memory=on_gpu,
                                             persistent_workers=args.workers > 0)
        mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
        std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255

    torch.manual_seed(args.seed)
    model = make_model(args.model).to(device, memory_format=torch.channels_last if on_gpu else torch.contiguous_format)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    if args.resume:
        ckpt = torch.load(args.resume, map_location=device)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        # Saved by rank 0 (every rank is at the same batch); a world of another size resumes the rest of
        # that epoch split over its ranks.
        loader.load_state_dict(ckpt["loader"])
    ddp = model
    if distributed:
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if on_gpu else None)
    log = open(f"{args.log_indices}.rank{rank}", "w") if args.log_indices else None

    # The fastpipe Loader counts epochs itself (each iter() is the next one; --resume sets where it is).
    start_epoch = loader.epoch if args.loader == "fastpipe" else 0
    for epoch in range(start_epoch, args.epochs):
        if args.loader == "torch":
            sampler.set_epoch(epoch)
        ddp.train()
        t0, steps = time.perf_counter(), 0
        for batch in itertools.islice(loader, args.steps):  # islice stops without reading a batch more
            x = batch["image"].to(device, non_blocking=True)
            y = batch["label"].to(device, non_blocking=True)
            if args.loader == "torch":
                x = (x.float() - mean) / std
                x = torch.where(torch.rand(len(x), 1, 1, 1, device=device) < 0.5, x.flip(3), x)
                x = x.contiguous(memory_format=torch.channels_last) if on_gpu else x
            elif gpu_loader:
                x = x.permute(0, 3, 1, 2)  # NHWC data as an NCHW-shaped channels_last tensor: no copy
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_gpu):
                loss = F.cross_entropy(ddp(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps += 1
            if log:
                log.write(json.dumps({"epoch": epoch, "loss": loss.item(), "index": batch["index"].tolist()}) + "\n")
            if rank == 0 and steps % args.print_every == 0:
                rate = steps * args.batch_size * world / (time.perf_counter() - t0)
                print(f"epoch {epoch} step {steps} loss {loss.item():.4f} {rate:.0f} images/s", flush=True)
        if rank == 0 and steps:
            elapsed = time.perf_counter() - t0
            wait = f", data wait {loader.stats()['wait_fraction']:.1%} so far" if args.loader == "fastpipe" else ""
            print(f"epoch {epoch}: {steps} steps, loss {loss.item():.4f}, "
                  f"{steps * args.batch_size * world / elapsed:.0f} images/s ({args.loader}{wait})", flush=True)
    if log:
        log.close()

    if args.save and rank == 0:
        # A Loader resumes from any rank's state: no collective gathers the others'.
        ckpt = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": loader.state_dict()}
        torch.save(ckpt, args.save + ".partial")
        os.replace(args.save + ".partial", args.save)
        print(f"saved {args.save}")
    del loader  # its workers end here (DataLoader's processes, fastpipe's threads)
    if distributed:
        dist.barrier()  # the ranks leave together: none tears its connections down while rank 0 still saves
        dist.destroy_process_group()
        if not on_gpu:
            # gloo frees each finished collective on a worker thread, and in torch 2.13 and 2.14 that takes
            # the GIL (a collective issued in backward keeps its Python context): a worker that comes to it
            # after the interpreter has begun to exit aborts the process ("terminate called without an
            # active exception", after all the work). Nothing in torch waits for those threads (they outlive
            # destroy_process_group), so the rank leaves without the interpreter's teardown.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)


if __name__ == "__main__":
    main()
