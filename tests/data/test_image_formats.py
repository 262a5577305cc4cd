"""Every image format torchvision's ImageFolder reads. PNG (every colour type and bit depth, interlaced,
short palettes, transparency chunks) and WebP are decoded in the reader threads, the others through
Pillow; every one bit-exact to Pillow's ``Image.open(...).convert("RGB")`` (what torchvision trains on),
crops within the JPEG path's tolerance, in trees of mixed formats and through torchvision's own
ImageFolder handed to the Loader."""

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import fastpipe
from fastpipe.transforms import CenterCrop, RandomResizedCrop

from image_files import PNG_MODES, animated_webp, pil_rgb_array, pillow_bytes, png_bytes, random_png
from jpegs import EXACT_TOL, as_hwc_255, jpeg_bytes, picture, pil_rgb, reference_center_crop, reference_resized_crop, write

pytestmark = [pytest.mark.timeout(180, method="thread"),
              # Pillow's note on palette transparency, raised by the reference decode itself
              pytest.mark.filterwarnings("ignore:Palette images with Transparency:UserWarning")]
PILLOW_FORMATS = ("BMP", "GIF", "TIFF", "PPM")


def read(path):
    with open(path, "rb") as f:
        return f.read()


@pytest.fixture
def c_decoders_only(monkeypatch):
    """Pillow as the fallback decoder refuses every record: a PNG or WebP that the reader threads' decoder
    (libspng, libwebp) did not decode fails, instead of a test comparing Pillow with Pillow."""
    from fastpipe.data import _pillow

    def refuse(data):
        raise AssertionError("the Pillow fallback decoded a record the C decoders should have")

    monkeypatch.setattr(_pillow, "decode_rgb", refuse)


def whole_images(ds):
    """Every image decoded whole (no transform), as (H, W, 3) uint8 arrays."""
    return [ds[i][0].numpy() for i in range(len(ds))]


@pytest.mark.parametrize("interlace", [False, True], ids=["sequential", "adam7"])
def test_png_of_every_colour_type_and_depth_decodes_as_pillow(tmp_path, rng, interlace, c_decoders_only):
    root = tmp_path / "t"
    for color_type, depth in PNG_MODES:
        for k in range(2):  # awkward sizes: 1 pixel, odd, wider than a packed byte's worth
            h, w = (1, 1) if k == 0 else (int(rng.integers(2, 40)), int(rng.integers(2, 40)))
            write(str(root / "c" / f"{color_type}_{depth}_{k}.png"),
                  random_png(rng, color_type, depth, h, w, interlace=interlace))
    ds = fastpipe.ImageFolder(str(root), cache_dir="off")
    assert not ds.bad and set(ds.image_formats) == {"PNG"}
    for (path, _), got in zip(ds.samples, whole_images(ds), strict=True):
        np.testing.assert_array_equal(got, pil_rgb_array(read(path)), err_msg=os.path.basename(path))


def test_webp_and_the_formats_pillow_decodes_match_pillow_and_are_counted(tmp_path, rng):
    pic = picture(rng, 37, 53)
    rgba = np.dstack([pic, rng.integers(0, 256, pic.shape[:2], dtype=np.uint8)])
    files = {"lossy.webp": pillow_bytes(pic, "WEBP", quality=80), "lossless.webp": pillow_bytes(pic, "WEBP", lossless=True),
             "alpha.webp": pillow_bytes(rgba, "WEBP", quality=70), "animated.webp": animated_webp([pic, 255 - pic]),
             "grey.pgm": pillow_bytes(pic[..., 0], "PPM")}
    files.update({f"x.{fmt.lower()}": pillow_bytes(pic, fmt) for fmt in PILLOW_FORMATS})
    files["gif_named.png"] = files.pop("x.gif")  # torchvision lists no .gif; formats are told by content
    for name, data in files.items():
        write(str(tmp_path / "t" / "c" / name), data)
    ds = fastpipe.ImageFolder(str(tmp_path / "t"), cache_dir="off")
    assert not ds.bad
    by_name = {os.path.basename(p): (f, tuple(hw)) for (p, _), f, hw in zip(ds.samples, ds.image_formats, ds.image_sizes, strict=True)}
    assert {n: f for n, (f, _) in by_name.items()} == {
        "alpha.webp": "WebP", "animated.webp": "WebP", "grey.pgm": "other", "lossless.webp": "WebP",
        "lossy.webp": "WebP", "x.bmp": "other", "gif_named.png": "other", "x.ppm": "other", "x.tiff": "other"}
    assert all(hw == (37, 53) for _, hw in by_name.values())  # Pillow's sizes for the formats it decodes
    for (path, _), got in zip(ds.samples, whole_images(ds), strict=True):
        np.testing.assert_array_equal(got, pil_rgb_array(read(path)), err_msg=os.path.basename(path))
    # Pillow holds the GIL for its records only: the animated WebP, PGM, BMP, GIF, TIFF and PPM, each epoch.
    ld = fastpipe.Loader(ds, batch_size=4, transforms={0: CenterCrop(24)}, timeout=60)
    for _ in range(2):
        assert sum(len(y) for _, y in ld) == len(ds)
    assert ld.stats()["images_pillow"] == 2 * 6


@pytest.mark.parametrize("fmt", ["PNG", "WEBP"])
def test_crops_of_png_and_webp_match_pillow(tmp_path, rng, fmt, c_decoders_only):
    sizes = [(91, 117), (40, 301), (257, 64), (2, 3)]
    for k, (h, w) in enumerate(sizes):
        write(str(tmp_path / "t" / "c" / f"{k}.{fmt.lower()}"), pillow_bytes(picture(rng, h, w), fmt, quality=75))
    ds = fastpipe.ImageFolder(str(tmp_path / "t"), cache_dir="off")
    # Central crops without a resize copy the decoded pixels: exactly Pillow's, at every offset (the
    # cropped WebP decode's chroma at the crop's edges included).
    for ch, cw in [(1, 1), (17, 31), (39, 2), (90, 116), (301, 301)]:
        t = CenterCrop((ch, cw), out_dtype=torch.uint8, layout="NHWC", dct_scaling=False)
        for (path, _), (x, _) in zip(ds.samples, fastpipe.Loader(ds, batch_size=1, transforms={0: t}), strict=True):
            ref = reference_center_crop(pil_rgb(path), (ch, cw), None)
            np.testing.assert_array_equal(x[0].numpy(), ref.astype(np.uint8), err_msg=f"{path} {(ch, cw)}")
    t = RandomResizedCrop((57, 91), mirror=0.5)
    ld = fastpipe.Loader(ds, batch_size=2, transforms={0: t}, seed=5)
    got = [x for xs, _ in ld for x in xs]
    assert ld.stats()["images_pillow"] == 0
    for (path, _), x, (top, left, h, w, flip) in zip(ds.samples, got, t.boxes(ds, range(len(ds)), 0, seed=5),
                                                     strict=True):
        diff = np.abs(as_hwc_255(x) - reference_resized_crop(pil_rgb(path), top, left, h, w, (57, 91), flip))
        assert diff.max() <= EXACT_TOL, f"{path} box {(top, left, h, w, flip)}: {diff.max()}"


def test_a_png_checksum_error_pillow_ignores_is_ignored_too(tmp_path, rng):
    data = bytearray(png_bytes(picture(rng, 20, 30), 2, 8, rng))  # its image data in two chunks
    at = data.index(b"IDAT")
    length = int.from_bytes(data[at - 4:at], "big")
    data[at + 4 + length] ^= 0xFF  # the first chunk's checksum, which Pillow does not verify
    write(str(tmp_path / "t" / "c" / "crc.png"), bytes(data))
    ds = fastpipe.ImageFolder(str(tmp_path / "t"), cache_dir="off")
    ld = fastpipe.Loader(ds, batch_size=1, transforms={0: CenterCrop((20, 30), out_dtype=torch.uint8, layout="NHWC")})
    (x, _), = list(ld)
    np.testing.assert_array_equal(x[0].numpy(), pil_rgb_array(bytes(data)))
    assert ld.stats()["images_pillow"] == 0  # decoded in the reader thread


def test_a_mixed_tree_through_torchvision_with_a_relative_root_matches_its_dataloader(tmp_path, rng, monkeypatch):
    tv = pytest.importorskip("torchvision")
    T = pytest.importorskip("torchvision.transforms.v2")
    writers = [lambda p: jpeg_bytes(p), lambda p: pillow_bytes(p, "PNG"), lambda p: pillow_bytes(p, "WEBP", quality=85),
               lambda p: pillow_bytes(p, "BMP"), lambda p: pillow_bytes(p, "GIF")]
    for k in range(15):
        # Names do not tell the format: a PNG named .JPEG, as in ImageNet.
        write(str(tmp_path / "data" / "train" / f"class{k % 3}" / f"{k}.JPEG"),
              writers[k % len(writers)](picture(rng, 40 + 3 * k, 70 - 2 * k)))
    monkeypatch.chdir(tmp_path)
    pipeline = T.Compose([T.Resize(36), T.CenterCrop(32), T.ToImage(), T.ToDtype(torch.float32, scale=True)])
    dataset = tv.datasets.ImageFolder("data/train", transform=pipeline)
    ours = list(fastpipe.Loader(dataset, batch_size=4))
    theirs = list(torch.utils.data.DataLoader(dataset, batch_size=4))
    for (x, y), (rx, ry) in zip(ours, theirs, strict=True):
        assert torch.equal(y, ry)
        assert float((x - rx).abs().max()) * 255 <= EXACT_TOL


def test_torchvision_datasets_own_file_lists_are_read(tmp_path, rng, monkeypatch):
    tv = pytest.importorskip("torchvision")
    T = tv.transforms
    for k in range(16):
        ext = [".jpg", ".png", ".webp", ".skip"][(k // 2) % 4]
        data = jpeg_bytes(picture(rng, 30, 30)) if ext in (".jpg", ".skip") else pillow_bytes(
            picture(rng, 30, 30), ext[1:].upper().replace("JPG", "JPEG"))
        write(str(tmp_path / "r" / f"c{k % 2}" / f"{k}{ext}"), data)
    monkeypatch.chdir(tmp_path)
    to_tensor = T.Compose([T.CenterCrop(24), T.PILToTensor()])

    class EvenOnly(tv.datasets.ImageFolder):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.samples = [s for s in self.samples if int(os.path.basename(s[0]).split(".")[0]) % 2 == 0]

    datasets = {
        "extensions": tv.datasets.DatasetFolder("r", loader=tv.datasets.folder.default_loader, extensions=(".skip", ".png"),
                                                transform=to_tensor),
        "is_valid_file": tv.datasets.ImageFolder("./r/", transform=to_tensor, is_valid_file=lambda p: "webp" not in p),
        "subclass": EvenOnly("r", transform=to_tensor),
    }
    for what, dataset in datasets.items():
        ours = list(fastpipe.Loader(dataset, batch_size=3))
        theirs = list(torch.utils.data.DataLoader(dataset, batch_size=3))
        assert sum(len(y) for _, y in ours) == len(dataset.samples), what
        for (x, y), (rx, ry) in zip(ours, theirs, strict=True):
            assert torch.equal(y, ry) and torch.equal(x, rx), what


def test_an_explicit_sample_list(tmp_path, rng, monkeypatch):
    for k in range(4):
        write(str(tmp_path / "a" / f"{k}.png"), pillow_bytes(picture(rng, 20 + k, 25), "PNG"))
        write(str(tmp_path / "b" / "deep" / f"{k}.jpg"), jpeg_bytes(picture(rng, 25, 20 + k)))
    monkeypatch.chdir(tmp_path)
    samples = [(f"a/{k}.png", k % 2) for k in range(4)] + [(str(tmp_path / "b" / "deep" / f"{k}.jpg"), 2)
                                                          for k in range(4)]
    ds = fastpipe.ImageFolder(samples=samples, classes=["x", "y", "z"], cache_dir=str(tmp_path / "cache"))
    assert ds.root == str(tmp_path) and ds.classes == ["x", "y", "z"]
    assert ds.samples == [(os.path.join(str(tmp_path), p) if not os.path.isabs(p) else p, c) for p, c in samples]
    for (path, _), got in zip(ds.samples, whole_images(ds), strict=True):
        np.testing.assert_array_equal(got, pil_rgb_array(read(path)))
    with pytest.raises(ValueError, match="class index 2 but classes names 2 classes"):
        fastpipe.ImageFolder(samples=samples, classes=["x", "y"], cache_dir="off")
    with pytest.raises(TypeError, match="root .* or samples"):
        fastpipe.ImageFolder(cache_dir="off")


def test_only_changed_files_are_read_again_when_a_folder_changes(tmp_path, rng, monkeypatch):
    root = tmp_path / "t"
    for k in range(6):
        write(str(root / f"c{k % 2}" / f"{k}.png"), pillow_bytes(picture(rng, 10 + k, 12), "PNG"))
    cache = str(tmp_path / "cache")
    first = fastpipe.ImageFolder(str(root), cache_dir=cache)
    assert first.rescanned
    read_again = []
    real_scan = fastpipe._ext._C.scan_image_files

    def counting_scan(root, names, offsets, threads):
        read_again.extend(names[offsets[i]:offsets[i + 1]].decode() for i in range(len(offsets) - 1))
        return real_scan(root, names, offsets, threads)

    monkeypatch.setattr(fastpipe._ext._C, "scan_image_files", counting_scan)
    again = fastpipe.ImageFolder(str(root), cache_dir=cache)
    assert not again.rescanned and read_again == []
    write(str(root / "c0" / "new.png"), pillow_bytes(picture(rng, 9, 9), "PNG"))   # a folder changes
    write(str(root / "c1" / "1.png"), pillow_bytes(picture(rng, 31, 7), "PNG"))   # a file is rewritten
    third = fastpipe.ImageFolder(str(root), cache_dir=cache)
    assert third.rescanned and sorted(read_again) == ["c0/new.png", "c1/1.png"]
    sizes = {os.path.relpath(p, root): tuple(hw) for (p, _), hw in zip(third.samples, third.image_sizes, strict=True)}
    assert sizes["c1/1.png"] == (31, 7) and sizes["c0/new.png"] == (9, 9) and sizes["c0/0.png"] == (10, 12)


def test_pillow_records_with_next_reading_the_batches(tmp_path, rng):
    # num_threads=0: the batches are read on torch's threads inside next(), which has let the GIL go.
    for k in range(8):
        write(str(tmp_path / "t" / "c" / f"{k}.bmp"), pillow_bytes(picture(rng, 16 + k, 16), "BMP"))
    ds = fastpipe.ImageFolder(str(tmp_path / "t"), cache_dir="off")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ld = fastpipe.Loader(ds, batch_size=3, num_threads=0, transforms={0: CenterCrop(16, out_dtype=torch.uint8)},
                             timeout=60)
    want = fastpipe.Loader(ds, batch_size=3, transforms={0: CenterCrop(16, out_dtype=torch.uint8)}, timeout=60)
    for (x, _), (rx, _) in zip(ld, want, strict=True):
        assert torch.equal(x, rx)
    assert ld.stats()["images_pillow"] == len(ds)


def test_what_the_fallback_decoder_keeps_stays_the_records_bytes(tmp_path, rng, monkeypatch):
    """Pillow is given each record's encoded bytes as its own bytes object, not a view of the reader's
    buffer (which the next record overwrites; a memoryview, even released after the call, lives on in
    any view made of it): what a decoder keeps is still that file's bytes after later records."""
    from fastpipe.data import _pillow

    kept, real = [], _pillow.decode_rgb

    def keeping(data):
        kept.append(memoryview(data))
        return real(data)

    monkeypatch.setattr(_pillow, "decode_rgb", keeping)
    for k in range(6):
        write(str(tmp_path / "t" / "c" / f"{k}.bmp"), pillow_bytes(picture(rng, 16 + k, 16), "BMP"))
    ds = fastpipe.ImageFolder(str(tmp_path / "t"), cache_dir="off")
    ld = fastpipe.Loader(ds, batch_size=2, num_threads=1, transforms={0: CenterCrop(16, out_dtype=torch.uint8)},
                         timeout=60)
    assert len(list(ld)) == 3
    assert sorted(bytes(v) for v in kept) == sorted(read(path) for path, _ in ds.samples)


def test_an_interlaced_png_over_the_reader_budget_is_refused_saying_why(tmp_path, rng, c_decoders_only):
    """An Adam7 PNG is decoded whole in its reader thread: past the budget (128 MiB of samples; a small
    one here) the record fails with the reason, and the same image without interlacing decodes."""
    samples = rng.integers(0, 256, (40, 50, 3))
    write(str(tmp_path / "t" / "c" / "a.png"), png_bytes(samples, 2, 8, rng, interlace=True))
    write(str(tmp_path / "u" / "c" / "a.png"), png_bytes(samples, 2, 8, rng, interlace=False))
    t = CenterCrop(32, out_dtype=torch.uint8)
    fastpipe._ext._C._png_interlaced_budget(40 * 50 * 3 - 1)
    try:
        with pytest.raises(ValueError, match=r"an interlaced PNG of 50x40 is decoded whole .* over the 0 MiB a reader"):
            list(fastpipe.Loader(fastpipe.ImageFolder(str(tmp_path / "t"), cache_dir="off"), batch_size=1,
                                 transforms={0: t}, timeout=60))
        (x, _), = fastpipe.Loader(fastpipe.ImageFolder(str(tmp_path / "u"), cache_dir="off"), batch_size=1,
                                  transforms={0: t}, timeout=60)
        assert x.shape == (1, 3, 32, 32)
    finally:
        fastpipe._ext._C._png_interlaced_budget(0)


@pytest.mark.parametrize("image_decode", ["host", "device"])
def test_a_mixed_tree_on_the_simulated_device_equals_the_cpu_loader(tmp_path, rng, image_decode):
    # Other formats are decoded on the CPU on a CUDA loader too (with image_decode="device", the JPEGs
    # the device is given are decoded there), and the batch copied.
    from fastpipe.data import _device

    writers = [jpeg_bytes, lambda p: pillow_bytes(p, "PNG"), lambda p: pillow_bytes(p, "WEBP", quality=85),
               lambda p: pillow_bytes(p, "BMP")]
    for k in range(8):
        write(str(tmp_path / "t" / f"c{k % 2}" / f"{k}.img.png"), writers[k % 4](picture(rng, 50 + k, 61)))
    ds = fastpipe.ImageFolder(str(tmp_path / "t"), cache_dir="off")
    t = CenterCrop(40, resize=44, dct_scaling=False)
    cpu = [(x.numpy().copy(), y.numpy().copy()) for x, y in fastpipe.Loader(ds, batch_size=3, transforms={0: t})]
    with _device.simulated(max_delay_us=100, seed=3) as sim:
        ld = fastpipe.Loader(ds, batch_size=3, transforms={0: t}, device="cuda", image_decode=image_decode,
                             timeout=60)
        dev = []
        for x, y in ld:
            sim.synchronize(sim.consumer_stream())
            dev.append((x.numpy().copy(), y.numpy().copy()))
        stats = ld.stats()
        del ld
        sim.drain()
    assert stats["images_pillow"] == 2
    if image_decode == "device":
        assert stats["images_decoded_on_device"] == 2 and stats["images_decoded_on_host"] == 6
    for (a, la), (b, lb) in zip(cpu, dev, strict=True):
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_allclose(b, a, atol=2e-5 * 255, rtol=0)


def test_sample_lists_of_one_root_keep_their_own_labels(tmp_path, rng):
    # Two subsets of one tree (a train and a validation split, say) alive together, and the tree's own
    # index scanned again under them: each reads its own files and labels.
    paths = [write(str(tmp_path / "t" / "c" / f"{k}.png"), pillow_bytes(picture(rng, 10 + k, 12), "PNG"))
             for k in range(6)]
    cache = str(tmp_path / "cache")
    a = fastpipe.ImageFolder(samples=[(p, 0) for p in paths[:4]], classes=["a", "b"], cache_dir=cache)
    b = fastpipe.ImageFolder(samples=[(p, 1) for p in paths[2:]], classes=["a", "b"], cache_dir=cache)
    fastpipe.ImageFolder(str(tmp_path / "t"), cache_dir=cache)
    again = fastpipe.ImageFolder(samples=[(p, 1) for p in paths[2:]], classes=["a", "b"], cache_dir=cache)
    assert not again.rescanned  # its own index, beside the tree's and the other list's
    write(str(tmp_path / "t" / "c" / "new.png"), pillow_bytes(picture(rng, 9, 9), "PNG"))
    assert len(fastpipe.ImageFolder(str(tmp_path / "t"), cache_dir=cache)) == 7
    t = {0: CenterCrop(8, out_dtype=torch.uint8)}
    for ds, label, files in ((a, 0, paths[:4]), (b, 1, paths[2:])):
        ys = torch.cat([y for _, y in fastpipe.Loader(ds, batch_size=3, transforms=t)])
        assert ys.tolist() == [label] * 4 and [p for p, _ in ds.samples] == files


def test_the_interpreter_exits_while_readers_decode_with_pillow(tmp_path, rng):
    """Reader threads that decode with Pillow take the GIL; one that asked for it after the interpreter
    began to finalize would never get it (or be ended holding the reader's locks). The interpreter's exit
    is announced first (atexit), so a script that ends with readers mid-decode exits at once and cleanly."""
    for k in range(64):
        write(str(tmp_path / "t" / "c" / f"{k}.bmp"), pillow_bytes(picture(rng, 40 + k % 5, 48), "BMP"))
    script = (
        "import fastpipe, torch\n"
        "from fastpipe.transforms import CenterCrop\n"
        f"ds = fastpipe.ImageFolder({str(tmp_path / 't')!r}, cache_dir='off')\n"
        "ld = fastpipe.Loader(ds, batch_size=2, num_threads=2, prefetch=8, "
        "transforms={0: CenterCrop(32, out_dtype=torch.uint8)})\n"
        "it = iter(ld)\n"
        "next(it)\n"
        "print('exiting', flush=True)\n"  # the readers are still decoding the batches read ahead
    )
    for _ in range(3):
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and "exiting" in proc.stdout, proc.stderr[-3000:]
        assert "Fatal Python error" not in proc.stderr, proc.stderr[-3000:]
