"""The peers of the remote suite (fastpipe/bench/remote.py) that read from S3: litdata (its own chunk format),
Mosaic streaming (MDS) and s3torchconnector (the same tar shards), each converted from the same images
and read from moto's S3 server through the endpoint the row uses, with DataLoader workers (k) decoding
with PIL and torchvision's RandomResizedCrop + flip + normalise, as their documentation shows.

Each peer is a function (images, labels, s3, endpoint, work, args) -> a loader factory; a peer whose
package is missing or that fails against the server is reported with the reason (PEERS' callers catch).
These packages are optional: `make bench-remote-peers` installs them (requirements/bench-remote-peers.txt)
into .venv-peers, an environment of their own (they pin numpy and cryptography versions) that sees .venv's
packages, and removes obstore (see litdata()); run the benchmark with `.venv-peers/bin/python`.
"""

import glob
import io
import multiprocessing
import os
import tarfile

import torch
from PIL import Image

from fastpipe.bench.shards import pil_transform


def _transform(size):
    tf = pil_transform(size)
    return lambda data: tf(Image.open(io.BytesIO(data)).convert("RGB"))


def _cache(work, peer, endpoint):
    """A peer's cache folder for one endpoint (its rows at another endpoint keep theirs)."""
    return os.path.join(work, f"{peer}-cache-{endpoint.rsplit(':', 1)[-1]}")


def _upload(s3, folder, prefix):
    """The converted dataset into the store, unless it holds it already (a store is used at two RTTs)."""
    if s3.keys("bench", prefix + "/"):
        return
    for path in sorted(glob.glob(os.path.join(folder, "**", "*"), recursive=True)):
        if os.path.isfile(path):
            with open(path, "rb") as f:
                s3.put("bench", f"{prefix}/{os.path.relpath(path, folder)}", f.read())


def _credentials(s3, endpoint):
    """The variables boto3 (Mosaic, litdata) and the AWS CRT (s3torchconnector) read, for the workers too."""
    os.environ.update(AWS_ACCESS_KEY_ID=s3.key, AWS_SECRET_ACCESS_KEY=s3.secret, AWS_DEFAULT_REGION="us-east-1",
                      AWS_REGION="us-east-1", S3_ENDPOINT_URL=endpoint, AWS_ENDPOINT_URL=endpoint)


class _LitdataItem:
    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __call__(self, i):
        with open(self.images[i], "rb") as f:
            return {"image": f.read(), "label": int(self.labels[i])}


def litdata(images, labels, s3, endpoint, work, args):
    import importlib.util

    import litdata as ld

    if importlib.util.find_spec("obstore") is not None:
        # litdata downloads chunks through obstore when it is installed, and builds its S3 store without
        # allow_http: reqwest then refuses every http:// endpoint (these servers', a MinIO without TLS)
        # with BadScheme. Without obstore it takes its boto3 path, which does.
        raise RuntimeError("litdata cannot read from http:// endpoints while obstore is installed "
                           "(pip uninstall obstore to run it on its boto3 path)")

    out = os.path.join(work, "litdata")
    if not os.path.isdir(out):
        method = multiprocessing.get_start_method(allow_none=True)
        ld.optimize(fn=_LitdataItem(images, labels), inputs=list(range(len(images))), output_dir=out,
                    chunk_bytes="64MB", num_workers=args.threads, verbose=False)
        multiprocessing.set_start_method(method, force=True)  # optimize() leaves "spawn" set for the process
    _upload(s3, out, "litdata")
    decode = _transform(args.size)
    cache = _cache(work, "litdata", endpoint)

    def make():
        _credentials(s3, endpoint)
        ds = ld.StreamingDataset("s3://bench/litdata", cache_dir=cache, shuffle=True, drop_last=True,
                                 storage_options={"endpoint_url": endpoint, "aws_access_key_id": s3.key,
                                                  "aws_secret_access_key": s3.secret},
                                 transform=lambda item: (decode(item["image"]), item["label"]))
        return ld.StreamingDataLoader(ds, batch_size=args.batch_size, num_workers=args.threads, drop_last=True)

    return make, cache


def mosaic(images, labels, s3, endpoint, work, args):
    import streaming

    out = os.path.join(work, "mds")
    if not os.path.isdir(out):
        with streaming.MDSWriter(out=out, columns={"image": "bytes", "label": "int"}, size_limit="64mb") as w:
            for path, label in zip(images, labels):
                with open(path, "rb") as f:
                    w.write({"image": f.read(), "label": int(label)})
    _upload(s3, out, "mds")
    decode = _transform(args.size)
    cache = _cache(work, "mds", endpoint)

    class Decoded(streaming.StreamingDataset):
        def __getitem__(self, i):
            item = super().__getitem__(i)
            return decode(item["image"]), item["label"]

    def make():
        _credentials(s3, endpoint)
        streaming.base.util.clean_stale_shared_memory()
        ds = Decoded(remote="s3://bench/mds", local=cache, shuffle=True, batch_size=args.batch_size)
        return torch.utils.data.DataLoader(ds, batch_size=args.batch_size, num_workers=args.threads, drop_last=True)

    return make, cache


class _TarSamples(torch.utils.data.IterableDataset):
    """The tar shards s3torchconnector streams, as (image, label) samples (its own dataset yields one
    reader an object; a sample per member pair is the user's to write)."""

    def __init__(self, objects, decode):
        self.objects, self.decode = objects, decode

    def __iter__(self):
        for reader in self.objects:
            with tarfile.open(fileobj=reader, mode="r|") as tar:
                image = None
                for member in tar:
                    data = tar.extractfile(member).read()
                    if member.name.endswith(".jpg"):
                        image = data
                    elif member.name.endswith(".cls"):
                        yield self.decode(image), int(data)


def s3torchconnector(images, labels, s3, endpoint, work, args):
    from s3torchconnector import S3ClientConfig, S3IterableDataset

    decode = _transform(args.size)

    urls = [f"s3://bench/{k}" for k in s3.keys("bench", "shards/")]  # listed here: not every server lists

    def make():
        _credentials(s3, endpoint)
        objects = S3IterableDataset.from_objects(urls, region="us-east-1", endpoint=endpoint,
                                                 s3client_config=S3ClientConfig(force_path_style=True),
                                                 enable_sharding=True)
        return torch.utils.data.DataLoader(_TarSamples(objects, decode), batch_size=args.batch_size,
                                           num_workers=args.threads, drop_last=True)

    return make, None


PEERS = {"litdata": litdata, "Mosaic streaming (MDS)": mosaic, "s3torchconnector (tar shards)": s3torchconnector}
