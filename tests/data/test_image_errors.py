"""Bad images: every kind fails its batch with an error naming the file (or record) and why under
on_error="raise", and is replaced by another sample, deterministically and counted, under
on_error="replace", so one bad file never stops or silently skews a run."""

import os
import warnings
import zlib

import numpy as np
import pytest
import torch

import fastpipe
from fastpipe.transforms import CenterCrop

from image_files import pillow_bytes
from jpegs import jpeg_bytes, picture, write

pytestmark = pytest.mark.timeout(120, method="thread")
N_GOOD = 7


def corrupt_scan(data):
    """Garbage over the middle of the entropy-coded data, the end-of-image marker kept. It holds 0xFF
    bytes followed by marker codes, which no intact scan does (garbage without them can decode as
    valid Huffman codes, silently, in any decoder)."""
    sos = data.index(b"\xff\xda")
    mid = sos + (len(data) - sos) // 2
    noise = bytes((37 * k + 11) % 256 for k in range(400))
    return data[:mid] + noise + data[mid + 400:]


def with_sof(data, marker):
    """The frame header's marker replaced: a lossless or hierarchical JPEG to a decoder."""
    at = data.index(b"\xff\xc0")
    return data[:at + 1] + bytes([marker]) + data[at + 2:]


def other_format(fmt, **save):
    """A small image in another format, from Pillow."""
    yy, xx = np.mgrid[0:30, 0:41]
    texture = (xx * 37 + yy * 91) % 23  # so that the compressed data spans a few hundred bytes
    return pillow_bytes(np.stack([xx * 6, yy * 8, 255 - xx * 3], axis=-1).astype(np.uint8) + texture[..., None].astype(
        np.uint8), fmt, **save)


def png_with_corrupt_data():
    """A PNG whose compressed image data is damaged, its chunk checksums made right again."""
    data = bytearray(other_format("PNG"))
    at = data.index(b"IDAT") + 4
    length = int.from_bytes(data[at - 8:at - 4], "big")
    data[at + length // 2:at + length // 2 + 8] = bytes(range(200, 208))
    data[at + length:at + length + 4] = zlib.crc32(bytes(data[at - 4:at + length])).to_bytes(4, "big")
    return bytes(data)


# kind -> (bytes from a good JPEG, the error class, what the message says). The bad file is named .jpg
# whatever it holds: formats are told by content.
BAD = {
    "truncated": (lambda d: d[:len(d) * 2 // 3], ValueError, "truncated: no end-of-image marker"),
    "truncated_header": (lambda d: d[:40], ValueError, "truncated: the file ends inside the JPEG header"),
    "garbage": (lambda d: bytes(range(256)) * 4, ValueError,
                r"not an image format this library knows; Pillow cannot decode it either \(ValueError: not a format it knows\)"),
    "empty": (lambda d: b"", ValueError, "truncated"),
    "png_truncated": (lambda d: other_format("PNG")[:-40], ValueError,
                      "truncated: the file ends inside the PNG image data"),
    "png_corrupt_data": (lambda d: png_with_corrupt_data(), ValueError,
                         "cannot be decoded: .*; Pillow cannot decode it either"),
    "webp_truncated": (lambda d: other_format("WEBP", quality=80)[:-60], ValueError,
                       "truncated: the file ends inside the WebP image data"),
    "bmp_truncated": (lambda d: other_format("BMP")[:-500], ValueError, "a BMP image; Pillow cannot decode it either"),
    "corrupt_scan": (corrupt_scan, ValueError, "cannot be decoded: Corrupt JPEG data: premature end of data segment"),
    "lossless": (lambda d: with_sof(d, 0xC3), ValueError, "unsupported: a lossless JPEG"),
    "hierarchical": (lambda d: with_sof(d, 0xC5), ValueError, "unsupported: a hierarchical JPEG"),
}


@pytest.fixture
def make_folder(tmp_path, rng):
    def make(kind):
        root = tmp_path / kind
        goods = [write(str(root / "c" / f"good{k}.jpg"), jpeg_bytes(picture(rng, 40 + k, 50))) for k in range(N_GOOD)]
        good = open(goods[0], "rb").read()
        bad = write(str(root / "c" / "bad.jpg"), BAD[kind][0](good))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the scan's warning about the bad file is tested below
            return fastpipe.ImageFolder(str(root), cache_dir="off"), bad
    return make


def every_batch(ds, **kw):
    # CenterCrop(resize): the crop covers the whole image, so damage anywhere in it is decoded.
    ld = fastpipe.Loader(ds, batch_size=3, transforms={0: CenterCrop(24, resize=(24, 24))}, timeout=60, **kw)
    return [(x.numpy().copy(), y.numpy().copy()) for x, y in ld], ld


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_bad_image_raises_naming_the_file_and_why(make_folder, kind):
    ds, bad = make_folder(kind)
    _, error, reason = BAD[kind]
    with pytest.raises(error, match=reason) as info:
        every_batch(ds)
    assert bad in str(info.value)


@pytest.mark.parametrize("kind", sorted(BAD))
def test_on_error_replace_substitutes_another_sample_deterministically(make_folder, kind):
    ds, bad = make_folder(kind)
    with pytest.warns(UserWarning, match="on_error='replace' substitutes") as record:
        first, ld = every_batch(ds, on_error="replace", shuffle=True, seed=3)
    assert len(record) == 1, "one warning per loader"
    stats = ld.stats()
    assert stats["images_replaced"] == 1
    assert bad in stats["replaced"][0] and "replaced by record" in stats["replaced"][0]
    assert sum(len(y) for _, y in first) == len(ds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again, _ = every_batch(ds, on_error="replace", shuffle=True, seed=3)
    for (a, la), (b, lb) in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)
    # The substitute is a good image, whole: its pixels are those of one of the good samples.
    images = np.concatenate([x for x, _ in first])
    reference, _ = every_batch(ds, sampler=[i for i in range(len(ds)) if ds.samples[i][0] != bad])
    refs = np.concatenate([x for x, _ in reference])
    for img in images:
        assert any(np.array_equal(img, r) for r in refs)


def test_the_scan_lists_the_files_it_cannot_decode(tmp_path, rng):
    root = tmp_path / "t"
    good = jpeg_bytes(picture(rng, 20, 30))
    write(str(root / "c" / "good.jpg"), good)
    write(str(root / "c" / "png_named.jpg"), other_format("PNG"))
    write(str(root / "c" / "real.png"), other_format("PNG"))
    write(str(root / "c" / "garbage.jpg"), bytes(range(256)) * 4)
    write(str(root / "c" / "cut.jpg"), good[:40])
    with pytest.warns(UserWarning, match=r"2 of 5 files cannot be decoded"):
        ds = fastpipe.ImageFolder(str(root), cache_dir="off")
    assert len(ds) == 5  # kept, so that indices and labels are torchvision's
    assert ds.image_formats == ["JPEG", "unknown", "JPEG", "PNG", "PNG"]  # sorted: cut, garbage, good, png_named, real
    assert sorted(os.path.basename(p) for _, p, _ in ds.bad) == ["cut.jpg", "garbage.jpg"]
    reasons = dict((os.path.basename(p), why) for _, p, why in ds.bad)
    assert "truncated: the file ends inside the JPEG header" in reasons["cut.jpg"]
    assert "not an image format this library knows; Pillow cannot read it either" in reasons["garbage.jpg"]
    with pytest.raises(ValueError, match="garbage.jpg.*not an image format this library knows"):
        ds[[i for i, (p, _) in enumerate(ds.samples) if p.endswith("garbage.jpg")][0]]


def test_a_file_deleted_or_rewritten_after_the_scan(make_folder, rng):
    ds, bad = make_folder("truncated")
    victim = ds.samples[0][0]
    os.remove(victim)
    with pytest.raises(FileNotFoundError, match=victim):
        every_batch(ds)
    # Back, another size than the scan recorded, its folder's time kept (as an in-place rewrite keeps it):
    # the index is reused, and the crop is drawn from the header read with the record.
    folder_time = os.stat(os.path.dirname(victim)).st_mtime_ns
    write(victim, jpeg_bytes(picture(rng, 13, 17)))
    os.utime(os.path.dirname(victim), ns=(folder_time, folder_time))
    got, _ = every_batch(ds, sampler=[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fresh = fastpipe.ImageFolder(ds.root, cache_dir="off")
    assert tuple(fresh.image_sizes[0]) == (13, 17) and tuple(ds.image_sizes[0]) != (13, 17)
    want, _ = every_batch(fresh, sampler=[0])
    np.testing.assert_array_equal(got[0][0], want[0][0])


def test_an_image_over_max_record_bytes_is_named(tmp_path, rng):
    root = tmp_path / "t"
    big = write(str(root / "c" / "big.jpg"), jpeg_bytes(picture(rng, 300, 300), quality=95))
    ds = fastpipe.ImageFolder(str(root), cache_dir="off", max_record_bytes=1000)
    with pytest.raises(ValueError, match=f"image '{big}': it is \\d+ bytes, more than max_record_bytes=1000"):
        every_batch(ds)


def test_a_packed_file_cut_short_is_refused_up_front_and_named(tmp_path, rng):
    items = [(jpeg_bytes(picture(rng, 20, 20 + k)), k) for k in range(4)]
    ds = fastpipe.write_images(items, str(tmp_path / "p"), progress=False)
    path = str(tmp_path / "p" / "images.bin")
    os.truncate(path, os.path.getsize(path) - 10)
    with pytest.raises(ValueError, match="images.bin' is .* bytes but its offsets need"):
        every_batch(fastpipe.ImageDataset(str(tmp_path / "p")))
    del ds


def test_replacement_gives_up_when_nothing_can_be_read(tmp_path):
    root = tmp_path / "t"
    for k in range(3):
        write(str(root / "c" / f"{k}.jpg"), bytes(range(256)) * 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = fastpipe.ImageFolder(str(root), cache_dir="off")
    with pytest.raises(ValueError, match="drew 16 other records for it and none could be read either"):
        every_batch(ds, on_error="replace")


def test_replaced_samples_keep_their_labels_consistent(tmp_path, rng):
    # Labels identify images: a replaced sample carries its substitute's label, never the bad one's.
    items = [(jpeg_bytes(picture(rng, 16, 16)), k) for k in range(6)]
    items[2] = (b"\xff\xd8\xff\xe0" + b"\x00" * 30, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = fastpipe.write_images(items, str(tmp_path / "p"), progress=False)
    assert ds.meta["skipped"] and len(ds) == 5  # write_images already left it out
    # The same defect in place: an ImageFolder of the same files.
    root = tmp_path / "t"
    for k, (data, _) in enumerate(items):
        write(str(root / f"class{k}" / "x.jpg"), data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        folder = fastpipe.ImageFolder(str(root), cache_dir="off")
        got, _ = every_batch(folder, on_error="replace", seed=1)
    good, _ = every_batch(folder, sampler=[0, 1, 3, 4, 5])
    by_label = {int(y): x for xs, ys in good for x, y in zip(xs, ys, strict=True)}
    for xs, ys in got:
        for x, y in zip(xs, ys, strict=True):
            assert int(y) != 2
            np.testing.assert_array_equal(x, by_label[int(y)])
