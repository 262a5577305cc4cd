"""fastpipe.WebDataset: tar shards indexed in C++ (core/tar_index.cpp) and read by the image path.

The references are independent: Python's tarfile for the archives' members, the webdataset package
itself for the samples, and an ImageFolder over the same images,
written as files in the same order, for the batches (its path is tested against Pillow and torchvision
elsewhere): the same images, labels and crops must come out of both, byte for byte.
"""

import json
import os
import re
import tarfile

import numpy as np
import pytest

import fastpipe
from fastpipe._ext import _C
from fastpipe.data import _device
from fastpipe.data.webdataset import expand_urls
from fastpipe.transforms import CenterCrop, RandomResizedCrop

from image_files import pillow_bytes
from jpegs import jpeg_bytes, picture
from tar_files import tar_bytes

wds = pytest.importorskip("webdataset", reason="the reference grouping is the webdataset package's (requirements/common.txt)")
braceexpand = pytest.importorskip("braceexpand")

pytestmark = pytest.mark.timeout(180, method="thread")
FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}


def write_shard(path, members, fmt="ustar"):
    with open(path, "wb") as f:
        f.write(tar_bytes(members, FORMATS[fmt]))
    return str(path)


def webdataset_samples(paths, image_exts=("jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp")):
    """The webdataset package's samples of the shards (its tar reader and grouping, an end-of-shard between
    shards), then fastpipe's choice of image (the first member with an image extension) and label (.cls):
    [(key, image bytes, label)]."""
    streams = [{"url": p, "stream": open(p, "rb")} for p in paths]
    try:
        samples = list(wds.tariterators.group_by_keys(wds.tariterators.tar_file_expander(streams)))
    finally:
        for s in streams:
            s["stream"].close()
    out = []
    for s in samples:
        images = [e for e in s if not e.startswith("__") and e.split(".")[-1] in image_exts]
        if images:
            out.append((s["__key__"], s[images[0]], int(s["cls"])))
    return out


def random_image(rng, kind):
    h, w = (int(v) for v in rng.integers(17, 90, 2))
    pic = picture(rng, h, w)
    if kind == "jpg":
        return jpeg_bytes(pic, subsampling=int(rng.integers(0, 3)))
    return pillow_bytes(pic, "PNG" if kind == "png" else "WEBP", **({"lossless": True} if kind == "webp" else {}))


@pytest.fixture
def shards(tmp_path, rng):
    """Three shards, one per tar format, with everything webdataset's grouping meets: subfolders, long
    names, upper-case extensions, extra members, multi-part extensions, metadata members, directories and
    a sample without an image."""
    out = []
    n = 0
    for k, fmt in enumerate(FORMATS):
        members = [("__info__", b"meta"), ("__meta__/x.jpg", b"skipped")] if k == 0 else [("sub", None)]
        for j in range(int(rng.integers(5, 9))):
            kind = ["jpg", "png", "webp"][int(rng.integers(0, 3))]
            key = f"sub/{'x' * (110 if fmt != 'ustar' and j == 0 else 3)}_{n:05d}"
            ext = kind.upper() if j == 2 else kind
            members += [(f"{key}.{ext}", random_image(rng, kind)), (f"{key}.cls", f"{int(rng.integers(0, 5))}\n".encode()),
                        (f"{key}.json", b'{"a": 1}')]
            if j == 1:
                members.insert(-2, (f"{key}.seg.png", random_image(rng, "png")))  # not the first image member
            n += 1
        members += [(f"sub/text_{k}.txt", b"no image"), (f"sub/text_{k}.cls", b"1")]
        out.append(write_shard(tmp_path / f"shard-{k:03d}.tar", members, fmt))
    return out


def folder_of(samples, root):
    """The samples' images as files, in their order, for an ImageFolder(samples=...)."""
    listing = []
    for i, (key, data, label) in enumerate(samples):
        path = root / f"{i:05d}.img"
        path.write_bytes(data)
        listing.append((str(path), label))
    return fastpipe.ImageFolder(samples=listing, cache_dir="off")


def batches(ds, transform, **kw):
    ld = fastpipe.Loader(ds, batch_size=5, transforms={0: transform}, timeout=60, **kw)
    return [(x.numpy().copy(), y.numpy().copy()) for x, y in ld]


def test_members_are_tarfiles_in_every_format(tmp_path, rng):
    names = ["a.jpg", "d/" + "n" * 140 + ".cls", "p" * 60 + "/" + "q" * 90 + ".x.y", "é.txt"]
    for fmt in FORMATS:
        if fmt == "ustar":  # ustar splits a long path at a slash into prefix and name, 100 + 155 at most
            names[1] = "d/" + "n" * 95 + ".cls"
        members = [("dir", None)] + [(n, rng.bytes(int(rng.integers(0, 1500)))) for n in names]
        path = write_shard(tmp_path / f"{fmt}.tar", members, fmt)
        with tarfile.open(path) as tar:
            expected = [(m.name.encode(), m.offset_data, m.size) for m in tar if m.isreg()]
        assert _C.read_tar_members(path) == expected, fmt


def test_samples_labels_and_order_are_webdatasets(shards):
    with pytest.warns(UserWarning, match="hold no image member"):
        ds = fastpipe.WebDataset(os.path.join(os.path.dirname(shards[0]), "shard-{000..002}.tar"))
    expected = webdataset_samples(shards)
    assert len(ds) == len(expected) and [ds.key(i) for i in range(len(ds))] == [k for k, _, _ in expected]
    assert ds.targets == [label for _, _, label in expected]
    assert ds.without_image == {s: 1 for s in shards} and ds.bad == []
    assert ds.urls == shards


@pytest.mark.parametrize("transform", [RandomResizedCrop(24, dct_scaling=False),
                                       CenterCrop((20, 28), resize=30, mean=(0.5, 0.4, 0.3), std=(0.2, 0.3, 0.1))],
                         ids=["rrc", "center"])
def test_batches_are_an_image_folders_of_the_same_images(shards, tmp_path, transform):
    with pytest.warns(UserWarning, match="hold no image member"):
        ds = fastpipe.WebDataset(shards)
    ref = folder_of(webdataset_samples(shards), tmp_path)
    for kw in (dict(shuffle=True, seed=5), dict(shuffle=False)):
        ours, theirs = batches(ds, transform, **kw), batches(ref, transform, **kw)
        assert len(ours) == len(theirs)
        for (x, y), (rx, ry) in zip(ours, theirs):
            np.testing.assert_array_equal(y, ry)
            np.testing.assert_array_equal(x, rx)


def test_on_the_simulated_device_as_on_the_host(shards):
    with pytest.warns(UserWarning, match="hold no image member"):
        ds = fastpipe.WebDataset(shards)
    transform = RandomResizedCrop(24, dct_scaling=False)
    host = batches(ds, transform, shuffle=True, seed=3)
    with _device.simulated(max_delay_us=200, seed=1) as sim:
        ld = fastpipe.Loader(ds, batch_size=5, transforms={0: transform}, timeout=60, device="cuda",
                             image_decode="device", shuffle=True, seed=3)
        device = []
        for x, y in ld:
            sim.synchronize(sim.consumer_stream())
            device.append((x.float().numpy().copy(), y.numpy().copy()))
        del ld
        sim.drain()
    for (x, y), (hx, hy) in zip(device, host):
        np.testing.assert_array_equal(y, hy)
        np.testing.assert_allclose(x, hx, atol=2e-5)


def test_a_bad_image_is_listed_and_replaced_or_named(tmp_path, rng):
    good = jpeg_bytes(picture(rng, 30, 40))
    bad = b"\x89PNG\r\n\x1a\n" + bytes(24)  # a PNG signature with a zeroed header
    path = write_shard(tmp_path / "s.tar", [("a.jpg", good), ("a.cls", b"0"), ("b.png", bad),
                                            ("b.cls", b"1"), ("c.jpg", good), ("c.cls", b"2")])
    with pytest.warns(UserWarning, match="1 of 3 images cannot be decoded"):
        ds = fastpipe.WebDataset(path, transform=CenterCrop(16))
    assert [(i, key) for i, key, _ in ds.bad] == [(1, "b")]
    with pytest.raises(ValueError, match=r"sample 'b' of '.*s\.tar'"):
        list(fastpipe.Loader(ds, batch_size=3, timeout=60))
    ld = fastpipe.Loader(ds, batch_size=3, timeout=60, on_error="replace")
    with pytest.warns(UserWarning, match=r"image sample 'b' of .*\(sample 1 of epoch 0 replaced by record"):
        (x, y), = list(ld)
    assert 1 not in y.tolist() and ld.stats()["images_replaced"] == 1


@pytest.mark.parametrize("members, match", [
    ([("k.jpg", b"x"), ("k.jpg", b"y"), ("k.cls", b"1")], r"sample 'k' holds two '\.jpg' members"),
    ([("k.jpg", b"x")], r"sample 'k' has no '\.cls' member"),
    ([("k.jpg", b"x"), ("k.cls", b"-1")], r"member 'k\.cls' holds '-1': a label must be a non-negative"),
    ([("k.jpg", b"x"), ("k.cls", b"7" * 80)], r"is 80 bytes: not a label"),
])
def test_samples_construction_refuses(tmp_path, members, match):
    path = write_shard(tmp_path / "s.tar", members)
    with pytest.raises(ValueError, match=match) as e:
        fastpipe.WebDataset(path)
    assert str(path) in str(e.value)


def test_malformed_archives_name_the_shard_and_the_entry(tmp_path, rng):
    data = tar_bytes([("a.jpg", rng.bytes(700)), ("a.cls", b"1")])
    cases = {"cut-data": data[:900], "cut-header": data[:1536 + 100], "checksum": data[:148] + b"0000000\0" + data[156:],
             "size": data[:124] + b"9" * 11 + b"\0" + data[136:]}
    for name, content in cases.items():
        path = tmp_path / f"{name}.tar"
        path.write_bytes(content)
        with pytest.raises(ValueError, match=rf"'{re.escape(str(path))}' is not a valid tar archive: the entry at "
                                             rf"offset \d+"):
            fastpipe.WebDataset(str(path))


def test_arguments_are_checked(tmp_path, shards):
    with pytest.raises(FileNotFoundError, match=r"1 of 2 shards do not exist"):
        fastpipe.WebDataset([shards[0], str(tmp_path / "missing.tar")])
    with pytest.raises(TypeError, match="urls must be"):
        fastpipe.WebDataset(3)
    with pytest.raises(ValueError, match="label must be"):
        fastpipe.WebDataset(shards, label=".cls")
    empty = write_shard(tmp_path / "empty.tar", [("a.txt", b"x")])
    with pytest.raises(ValueError, match="hold no sample with an image member"):
        fastpipe.WebDataset(empty)


def test_urls_expand_as_webdatasets():
    for pattern in ("a-{08..11}.tar", "{train,val}-{0..1}.tar", "s3://b/{a,b}/x-{000000..000002}.tar", "plain.tar",
                    "a-{7..12}.tar", "{x,y,}.tar", "{1..010}", "{5..1}", "{0..9..4}", "{a..d}", "a{b{c,d}e,f}g",
                    "{-2..2}", "{c..a..2}"):
        assert expand_urls(pattern) == list(braceexpand.braceexpand(pattern)), pattern
    assert expand_urls(["x.tar", "y-{000..001}.tar"]) == ["x.tar", "y-000.tar", "y-001.tar"]
    for bad, match in (("a-{1..2.tar", "unbalanced"), ("a-1}.tar", "unbalanced"), ("a-{x}.tar", "neither a range")):
        with pytest.raises(ValueError, match=match):
            expand_urls(bad)


def random_json(rng, depth=0):
    """A random JSON value: nesting, escapes, non-ASCII text, numbers of every form."""
    kind = int(rng.integers(0, 7 if depth < 4 else 4))
    if kind == 0:
        return int(rng.integers(-10**12, 10**12))
    if kind == 1:
        return float(rng.normal() * 10.0 ** int(rng.integers(-5, 6)))
    if kind == 2:
        return "".join(rng.choice(list('ab"\\/\b\f\n\r\té€😀\x01 ')) for _ in range(int(rng.integers(0, 8))))
    if kind == 3:
        return [None, True, False][int(rng.integers(0, 3))]
    if kind == 4:
        return [random_json(rng, depth + 1) for _ in range(int(rng.integers(0, 4)))]
    return {random_key(rng): random_json(rng, depth + 1) for _ in range(int(rng.integers(0, 4)))}


def random_key(rng):
    return rng.choice(["label", "lab\u00e9l", "x", "label2", "😀", 'l"a', "cls"])


def test_json_fields_are_json_loads(rng):
    """The parser against Python's json on random documents: the same value, or an error where json.loads
    has no non-negative int there."""
    for _ in range(600):
        doc = {random_key(rng): random_json(rng) for _ in range(int(rng.integers(0, 5)))}
        if rng.random() < 0.5:
            doc[random_key(rng)] = int(rng.integers(0, 2**62))
        text = json.dumps(doc, ensure_ascii=bool(rng.integers(0, 2)), indent=[None, 1][int(rng.integers(0, 2))])
        pairs = json.loads(text, object_pairs_hook=list)  # duplicate keys: the last one counts, as json.loads
        for field in ("label", "lab\u00e9l", "😀", 'l"a'):
            value = dict(pairs).get(field, "missing")
            ok = type(value) is int and value >= 0
            if ok:
                assert _C._json_integer_field(text.encode(), field) == value, (text, field)
            else:
                with pytest.raises(ValueError, match="has no field" if value == "missing" else "a label must be"):
                    _C._json_integer_field(text.encode(), field)
    for bad in (b'{"label": 1', b'{"label": 01}', b'{"label": 1} x', b'{"a": "\x01", "label": 1}',
                b'{"label": 1,}', b'{"a": tru, "label": 1}', b'{"a": "\\q", "label": 1}', b"{'label': 1}"):
        with pytest.raises(json.JSONDecodeError):
            json.loads(bad)
        with pytest.raises(ValueError):
            _C._json_integer_field(bad, "label")
    assert _C._json_integer_field(b'{"label": "x", "label": 5}', "label") == json.loads('{"label": "x", "label": 5}')["label"]
    with pytest.raises(ValueError, match="a label must be"):  # the last duplicate counts, as in json.loads
        _C._json_integer_field(b'{"label": 5, "label": "x"}', "label")
    with pytest.raises(ValueError, match="is not a JSON object"):
        _C._json_integer_field(b'[{"label": 1}]', "label")
    assert _C._json_integer_field(b'\xef\xbb\xbf{"a": NaN, "b": -Infinity, "label": 7}', "label") == 7
    with pytest.raises(ValueError, match="out of range"):
        _C._json_integer_field(b'{"label": 9223372036854775808}', "label")


def test_labels_from_a_json_field(tmp_path, rng):
    good = jpeg_bytes(picture(rng, 20, 30))
    members = []
    for k in range(5):
        members += [(f"s{k}.jpg", good), (f"s{k}.json", json.dumps({"meta": {"label": -1}, "class_id": k * 3}).encode())]
    ds = fastpipe.WebDataset(write_shard(tmp_path / "s.tar", members), label="json", label_field="class_id")
    assert ds.targets == [0, 3, 6, 9, 12]
    bad = write_shard(tmp_path / "b.tar", [("k.jpg", good), ("k.json", b'{"class_id": "3"}')])
    with pytest.raises(ValueError, match=r"member 'k\.json' has field 'class_id' = \"3\": a label must be a non-negative"):
        fastpipe.WebDataset(bad, label="json", label_field="class_id")
    with pytest.raises(ValueError, match="label_field must be"):
        fastpipe.WebDataset(bad, label="json", label_field="")


def test_the_index_is_kept_and_reread_only_when_a_shard_changes(shards, tmp_path, monkeypatch):
    from fastpipe.data import webdataset

    calls = []
    real = _C.index_webdataset
    monkeypatch.setattr(webdataset._C, "index_webdataset", lambda *a: calls.append(a) or real(*a))
    cache = tmp_path / "index"

    def made():
        with pytest.warns(UserWarning, match="hold no image member"):
            return fastpipe.WebDataset(shards, index_cache=cache)

    first, second = made(), made()
    assert len(calls) == 1, "the second construction read the shards again"
    assert [first.key(i) for i in range(len(first))] == [second.key(i) for i in range(len(second))]
    assert first.targets == second.targets and first.without_image == second.without_image
    np.testing.assert_array_equal(first.image_sizes, second.image_sizes)
    assert first.image_formats == second.image_formats
    os.utime(shards[1], ns=(os.stat(shards[1]).st_atime_ns, os.stat(shards[1]).st_mtime_ns + 10**9))
    made()
    assert len(calls) == 2, "a shard whose modification time changed must be read again"
    with pytest.warns(UserWarning, match="hold no image member"):
        fastpipe.WebDataset(shards, index_cache="off")
    assert len(calls) == 3 and len(os.listdir(cache)) == 2
