"""JPEGs decoded on the device (Loader(device="cuda", image_decode="device")): on the simulated device
(core/sim_device.h) the whole path runs on the CPU: the reader threads hand over each record's encoded
bytes and geometry (decoding themselves only what the device is not given), the simulated decoder
(libjpeg's raw output: YCbCr planes, as nvJPEG's planar output; or its RGB, as nvJPEG's interleaved
output) fills the staging in stream order, and the resample kernel's per-element code
(image_transform.h: resample_element, with jpeg_color.h's upsampling and colour conversion for planes)
makes the outputs. Checked against the host path, which sums the same weights in another order; on a
GPU (the gpu tests) nvJPEG's IDCT differs from libjpeg's a little.
"""

import gc
import os
import warnings

import numpy as np
import pytest
import torch

import fastpipe
from fastpipe.data import _device
from fastpipe.transforms import CenterCrop, RandomCrop, RandomErasing, RandomResizedCrop

from jpegs import CJPEG, NEEDS_CJPEG, SAMPLINGS, jpeg_bytes, picture, write

pytestmark = pytest.mark.timeout(180, method="thread")
IMAGENET = dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
# Summing the taps per element instead of row by row changes float32 rounding only.
FLOAT_TOL = 2e-5


@pytest.fixture
def folder(tmp_path, rng):
    root = tmp_path / "t"
    for k, (h, w) in enumerate([(75, 100), (100, 75), (61, 89), (40, 40), (90, 31), (120, 160)]):
        write(str(root / f"c{k % 2}" / f"{k}.jpg"), jpeg_bytes(picture(rng, h, w), subsampling=k % 3))
    return fastpipe.ImageFolder(str(root), cache_dir="off")


def host_batches(ds, transform, **kw):
    ld = fastpipe.Loader(ds, batch_size=4, transforms={0: transform}, timeout=60, **kw)
    return [(x.float().numpy().copy(), y.numpy().copy()) for x, y in ld]


def device_batches(ds, transform, sim_delay=100, fail=None, layout="planar", **kw):
    with _device.simulated(max_delay_us=sim_delay, seed=7) as sim:
        sim.set_jpeg_layout(layout)
        if fail:
            sim._fail(*fail)
        ld = fastpipe.Loader(ds, batch_size=4, transforms={0: transform}, timeout=60, device="cuda",
                             image_decode="device", **kw)
        out = []
        for x, y in ld:
            sim.synchronize(sim.consumer_stream())
            out.append((x.float().numpy().copy(), y.numpy().copy()))
        stats = ld.stats()
        del ld
        sim.drain()
        assert not sim.misuses()
    return out, stats


@pytest.mark.parametrize("transform", [
    RandomResizedCrop(48, dct_scaling=False, **IMAGENET),
    RandomResizedCrop((33, 21), scale=(0.5, 1.0), layout="NHWC", dct_scaling=False),
    CenterCrop(40, resize=44, out_dtype=torch.bfloat16, dct_scaling=False, **IMAGENET),
    CenterCrop(120, dct_scaling=False),  # larger than some images: padding
    RandomResizedCrop(40, dct_scaling=False, erase=RandomErasing(0.7, value=(1.0, -2.0, 0.5)), **IMAGENET),
    RandomCrop((36, 44), resize=52, dct_scaling=False, **IMAGENET),
    RandomCrop(48, padding=(2, 5, 7, 1), pad_if_needed=True, dct_scaling=False),
], ids=["rrc", "rrc-nhwc", "center-bf16", "center-pad", "rrc-erasing", "random-crop", "random-crop-padded"])
@pytest.mark.parametrize("layout", ["planar", "rgb"])
def test_device_decode_matches_the_host_path(folder, transform, layout):
    host = host_batches(folder, transform, seed=5, shuffle=True)
    dev, stats = device_batches(folder, transform, seed=5, shuffle=True, layout=layout)
    # Every record one way or the other (shrinks of more than 4x, e.g. to 21 columns, stay on the host).
    assert stats["images_decoded_on_device"] + stats["images_decoded_on_host"] == len(folder)
    assert stats["images_decoded_on_device"] >= len(folder) // 2
    planar = stats["images_decoded_on_device"] if layout == "planar" else 0
    assert stats["images_decoded_planar"] == planar
    assert stats["jpeg_decoder"] == f"simulated libjpeg ({'planar YCbCr' if layout == 'planar' else 'interleaved RGB'})"
    tol = 1e-2 if transform.out_dtype == torch.bfloat16 else FLOAT_TOL * 255  # values are normalised
    for (a, la), (b, lb) in zip(host, dev, strict=True):
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_allclose(b, a, atol=tol, rtol=0 if transform.out_dtype != torch.bfloat16 else 1e-2)


@pytest.fixture
def samplings(tmp_path, rng):
    """Every chroma sampling the device decodes, at sizes odd and even."""
    root = tmp_path / "s"
    sizes = [(75, 100), (61, 89), (90, 31), (120, 160)]
    for name, encode in sorted(SAMPLINGS.items()):
        if name in NEEDS_CJPEG and CJPEG is None:  # the others are still checked
            continue
        for k, (h, w) in enumerate(sizes):
            write(str(root / name / f"{k}.jpg"), encode(picture(rng, h, w)))
    return fastpipe.ImageFolder(str(root), cache_dir="off")


def test_every_sampling_decodes_on_the_device_as_on_the_host(samplings):
    """Planes upsampled and converted in the resample kernel are libjpeg's RGB: only float rounding differs."""
    t = RandomResizedCrop(40, scale=(0.3, 1.0), dct_scaling=False)
    host = host_batches(samplings, t, seed=3)
    dev, stats = device_batches(samplings, t, seed=3)
    assert stats["images_decoded_planar"] == stats["images_decoded_on_device"] == len(samplings)
    for (a, la), (b, lb) in zip(host, dev, strict=True):
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_allclose(b, a, atol=FLOAT_TOL * 255)


def test_device_decode_is_the_host_path_without_dct_scaling(samplings):
    """By default the host decodes at 1/2 or 1/4 in the DCT where a crop shrinks that much; the device
    decodes the whole image, so each device-decoded sample is the exact path's (dct_scaling=False), each
    host-decoded one the default path's. (The DCT-scaled path's own distance from the exact one is
    printed: on these hard-edged pictures means of 0.4-10 levels, on a photograph 0.6-1.5.)"""
    t = RandomResizedCrop(24, scale=(0.5, 1.0), layout="NHWC", out_dtype=torch.uint8)
    exact_t = RandomResizedCrop(24, scale=(0.5, 1.0), layout="NHWC", out_dtype=torch.uint8, dct_scaling=False)
    host = np.concatenate([a for a, _ in host_batches(samplings, t, seed=11)])
    exact = np.concatenate([a for a, _ in host_batches(samplings, exact_t, seed=11)])
    dev, stats = device_batches(samplings, t, seed=11)
    dev = np.concatenate([b for b, _ in dev])
    like_exact = [np.abs(d - e).max() <= 1 and np.abs(d - h).max() > 1 for d, e, h in zip(dev, exact, host, strict=True)]
    like_host = [np.abs(d - h).max() <= 1 for d, h in zip(dev, host, strict=True)]
    assert all(a or b for a, b in zip(like_exact, like_host, strict=True))
    assert 0 < sum(like_exact) <= stats["images_decoded_on_device"] < len(samplings)
    d = np.abs(exact - host)
    print(f"DCT-scaled host path vs exact: mean {d.mean():.2f} levels, p99 {np.percentile(d, 99):.1f}")


def test_records_the_device_is_not_given_are_decoded_on_the_host(tmp_path, rng):
    root = tmp_path / "t"
    pic = picture(rng, 60, 80)
    kinds = {"baseline": jpeg_bytes(pic), "progressive": jpeg_bytes(pic, progressive=True),
             "cmyk": jpeg_bytes(pic, mode="CMYK"), "gray": jpeg_bytes(pic, mode="L"),
             "big": jpeg_bytes(picture(rng, 1100, 1000)), "baseline2": jpeg_bytes(picture(rng, 50, 70))}
    for name, data in kinds.items():
        write(str(root / "c" / f"{name}.jpg"), data)
    ds = fastpipe.ImageFolder(str(root), cache_dir="off")
    # The big one is over the pixel budget (twice the mean) and shrinks more than 4x to 32x32.
    t = CenterCrop(32, resize=36, dct_scaling=False)
    host = host_batches(ds, t)
    dev, stats = device_batches(ds, t)
    assert stats["images_decoded_on_device"] == 3  # baseline, baseline2, gray
    assert stats["images_decoded_on_host"] == 3    # progressive, cmyk, big
    for (a, _), (b, _) in zip(host, dev, strict=True):
        np.testing.assert_allclose(b, a, atol=FLOAT_TOL * 255)


@pytest.mark.filterwarnings("ignore:fastpipe.Loader. the program holds every one")
def test_the_submitter_thread_under_held_dropped_abandoned_and_overflowing_batches(tmp_path, rng):
    """Each batch's decode is queued by the pipeline's submitter thread while the loop holds batches out of
    order (more than the slots: overflow batches), abandons passes midway and closes with work in flight,
    on streams with random delays: every batch equals the host path's and a held one never changes."""
    root = tmp_path / "t"
    for k in range(40):
        h, w = 40 + 7 * (k % 5), 60 - 5 * (k % 4)
        write(str(root / f"c{k % 3}" / f"{k}.jpg"), jpeg_bytes(picture(rng, h, w), subsampling=k % 3))
    ds = fastpipe.ImageFolder(str(root), cache_dir="off")
    t = RandomResizedCrop(24, scale=(0.5, 1.0), dct_scaling=False)
    stops = [None, 2, None, 1, None, 1]  # passes 1, 3 and 5 abandoned after that many batches
    hl = fastpipe.Loader(ds, batch_size=4, transforms={0: t}, shuffle=True, seed=9, timeout=60)
    want = []
    for stop in stops:
        want.append([])
        for x, _ in hl:
            want[-1].append(x.numpy().copy())
            if len(want[-1]) == stop:
                break
    order = np.random.default_rng(int(rng.integers(1 << 30)))
    with _device.simulated(max_delay_us=2000, seed=3) as sim:
        ld = fastpipe.Loader(ds, batch_size=4, transforms={0: t}, shuffle=True, seed=9, timeout=60, device="cuda",
                             image_decode="device", prefetch=1, when_full="allocate")
        held = []
        for p, stop in enumerate(stops[:-1]):
            got = 0
            for x, _ in ld:
                sim.synchronize(sim.consumer_stream())
                np.testing.assert_allclose(x.numpy(), want[p][got], atol=FLOAT_TOL * 255)
                got += 1
                if order.random() < 0.5:
                    held.append((x, want[p][got - 1]))
                while len(held) > 5 or (held and order.random() < 0.3):
                    x_held, expected = held.pop(int(order.integers(len(held))))
                    sim.synchronize(sim.consumer_stream())
                    np.testing.assert_allclose(x_held.numpy(), expected, atol=FLOAT_TOL * 255)
                if got == stop:
                    break
            assert got == len(want[p])
        stats = ld.stats()
        assert stats["overflow_batches"] > 0 and stats["images_decoded_on_device"] > 0
        x_last, _ = next(iter(ld))
        ld.close()  # with the next batches' decode queued
        sim.synchronize(sim.consumer_stream())
        np.testing.assert_allclose(x_last.numpy(), want[-1][0], atol=FLOAT_TOL * 255)
        del ld, held, x_last
        sim.drain()
        assert not sim.misuses()


def test_a_host_batch_is_refilled_only_after_the_device_decoded_it(tmp_path, rng):
    """The decoder reads the bitstreams from the host batch in stream order (nvJPEG copies them to the
    device on its stream): the reader must not refill that batch before the decode's stream got there,
    however far the streams lag (the simulation reads them again then and reports any change)."""
    root = tmp_path / "t"
    for k in range(48):
        write(str(root / "c" / f"{k}.jpg"), jpeg_bytes(picture(rng, 30 + k % 7, 40), subsampling=k % 3))
    ds = fastpipe.ImageFolder(str(root), cache_dir="off")
    t = CenterCrop(16, dct_scaling=False)
    with _device.simulated(max_delay_us=5000, seed=int(rng.integers(1 << 30))) as sim:
        ld = fastpipe.Loader(ds, batch_size=2, transforms={0: t}, device="cuda", image_decode="device", prefetch=1,
                             timeout=60)
        for _ in range(2):
            n = sum(len(y) for _, y in ld)  # the consumer never waits: the readers run ahead of the streams
            assert n == len(ds)
        del ld
        sim.drain()
        assert not sim.misuses()


def test_a_failing_device_decode_reaches_the_loop_at_its_batch(folder):
    t = CenterCrop(24, resize=30, dct_scaling=False)
    with pytest.raises(RuntimeError, match="decode_jpegs failed"):
        device_batches(folder, t, fail=("decode", 1, 1))


@pytest.mark.parametrize("layout", ["planar", "rgb"])
def test_a_batch_the_decoder_refuses_is_decoded_by_libjpeg(folder, layout):
    """nvJPEG refuses a whole batch for one JPEG it finds corrupt (some that libjpeg decodes): the batch's
    images are then decoded by libjpeg in the loader's device thread, into planes, and match the host path."""
    t = CenterCrop(24, resize=30, dct_scaling=False)
    host = host_batches(folder, t, seed=5)
    dev, stats = device_batches(folder, t, seed=5, fail=("reject", 1, 1), layout=layout)  # the second batch's
    assert 0 < stats["images_decoded_after_refusal"] < stats["images_decoded_on_device"] == len(folder)
    # Planar: the device's own decodes into planes (libjpeg's after the refusal are not the device's).
    assert stats["images_decoded_planar"] == (
        stats["images_decoded_on_device"] - stats["images_decoded_after_refusal"] if layout == "planar" else 0)
    for (a, la), (b, lb) in zip(host, dev, strict=True):
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_allclose(b, a, atol=FLOAT_TOL * 255)


@pytest.mark.parametrize("bad", [4, 5])
def test_a_jpeg_neither_decoder_takes_fails_its_batch_naming_the_sample(tmp_path, rng, bad):
    """The batch [4, 5] with its first or second image corrupt. The second: libjpeg decodes sample 4 before
    it meets 5, and no copy of 4's planes may be left in flight (the teardown unpins them at once, and
    the slow streams here would read them after that: the simulation reports it)."""
    root = tmp_path / "t"
    for k in range(6):
        data = bytearray(jpeg_bytes(picture(rng, 50, 70)))
        if k == bad:  # a restart marker inside the scan: its markers and end are intact, its data is not
            mid = (data.index(b"\xff\xda") + len(data)) // 2
            data[mid:mid + 2] = b"\xff\xd3"
        write(str(root / "c" / f"{k}.jpg"), bytes(data))
    ds = fastpipe.ImageFolder(str(root), cache_dir="off")
    t = CenterCrop(24, resize=30, dct_scaling=False)
    with _device.simulated(max_delay_us=20000, seed=int(rng.integers(1 << 30))) as sim:
        ld = fastpipe.Loader(ds, batch_size=2, transforms={0: t}, device="cuda", image_decode="device", timeout=60)
        it = iter(ld)
        for _ in range(2):  # samples 0-3
            next(it)
        with pytest.raises(ValueError, match=f"sample {bad} cannot be decoded: the device's decoder refused its batch"):
            next(it)
        del it, ld
        sim.drain()
        assert not sim.misuses()


def test_device_decode_needs_a_device_and_images(folder, tmp_path):
    t = CenterCrop(24)
    with pytest.raises(ValueError, match="image_decode='device' decodes JPEGs on the Loader's GPU"):
        fastpipe.Loader(folder, batch_size=2, transforms={0: t}, image_decode="device")
    np.save(tmp_path / "x.npy", np.zeros((4, 3), np.float32))
    with _device.simulated():
        with pytest.raises(ValueError, match="NpyDataset has none"):
            fastpipe.Loader(fastpipe.NpyDataset(str(tmp_path / "x.npy")), batch_size=2, device="cuda",
                            image_decode="device")


def test_the_environment_chooses_auto(folder, monkeypatch):
    t = CenterCrop(24, resize=30, dct_scaling=False)
    monkeypatch.setenv("FASTPIPE_IMAGE_DECODE", "device")
    with _device.simulated() as sim:
        ld = fastpipe.Loader(folder, batch_size=3, transforms={0: t}, device="cuda")
        for _ in ld:
            pass
        assert ld.stats()["images_decoded_on_device"] == len(folder)
        del ld
        sim.drain()
    monkeypatch.setenv("FASTPIPE_IMAGE_DECODE", "gpu")
    with pytest.raises(ValueError, match="FASTPIPE_IMAGE_DECODE must be"):
        with _device.simulated():
            fastpipe.Loader(folder, batch_size=3, transforms={0: t}, device="cuda")


@pytest.mark.gpu
def test_nvjpeg_decode_on_a_gpu_is_close_to_the_host_path(folder):
    ok, why = fastpipe._ext._C.nvjpeg_status(torch.cuda.current_device(), _device.nvjpeg_library())
    if not ok:
        pytest.skip(f"nvJPEG unavailable: {why}")
    t = RandomResizedCrop(48, dct_scaling=False)
    host = host_batches(folder, t, seed=5)
    ld = fastpipe.Loader(folder, batch_size=4, transforms={0: t}, seed=5, device="cuda", image_decode="device")
    dev = [(x.float().cpu().numpy(), y.cpu().numpy()) for x, y in ld]
    stats = ld.stats()
    assert stats["images_decoded_on_device"] == len(folder)
    _, backend = fastpipe._ext._C.nvjpeg_status(torch.cuda.current_device(), _device.nvjpeg_library())
    print("nvJPEG:", backend, "| decoded into planes:", stats["images_decoded_planar"])
    diff = np.abs(np.concatenate([b for b, _ in dev]) - np.concatenate([a for a, _ in host])) * 255
    subsampling = [int(os.path.basename(folder._path(i))[:-4]) % 3 for i in range(len(folder))]  # PIL's: 0 = 4:4:4
    for d, s in zip(diff, subsampling, strict=True):
        print(f"subsampling {s}: mean {d.mean():.2f} levels, p99 {np.percentile(d, 99):.1f}, max {d.max():.1f}")
    # Without chroma subsampling nvJPEG's IDCT gave libjpeg-turbo's bytes exactly on an H200.
    full = np.stack([d for d, s in zip(diff, subsampling, strict=True) if s == 0])
    assert full.max() <= 1.0, full.max()
    # Interleaved RGB upsampled the chroma otherwise than libjpeg-turbo's triangle ("fancy") filter: on
    # these pictures' hard colour edges an H200 gave means of 2.9-6.6 levels, p99 17-47, max 76. Planes
    # upsampled and converted as libjpeg does leave the IDCT's rounding only (issue 30's accuracy).
    assert stats["images_decoded_planar"] == len(folder), backend
    assert stats["jpeg_decoder"].endswith("(planar YCbCr)"), stats["jpeg_decoder"]  # both lanes, decided once
    part = np.stack([d for d, s in zip(diff, subsampling, strict=True) if s != 0])
    assert part.mean() <= 1.0 and np.percentile(part, 99) <= 4.0, (part.mean(), np.percentile(part, 99))
    for (_, la), (_, lb) in zip(host, dev, strict=True):
        np.testing.assert_array_equal(la, lb)


@pytest.mark.gpu
@pytest.mark.parametrize("sampling", sorted(SAMPLINGS))
def test_nvjpeg_writes_only_inside_each_images_planes(sampling, rng):
    """Every image decoded into a region of its own between guard bytes, on the backend nvJPEG picks (the
    hardware engines where the GPU has them): odd sizes and every chroma sampling the device is given
    write only inside their planes (or interleaved RGB), and the planes are libjpeg's to the IDCT."""
    ok, why = fastpipe._ext._C.nvjpeg_status(torch.cuda.current_device(), _device.nvjpeg_library())
    if not ok:
        pytest.skip(f"nvJPEG unavailable: {why}")
    sizes = [(1, 1), (7, 13), (33, 17), (17, 33), (64, 48), (101, 3), (3, 101)]
    jpegs = [SAMPLINGS[sampling](picture(rng, h, w)) for h, w in sizes]
    layout, outputs, overwritten = fastpipe._ext._C._nvjpeg_guarded_decode(jpegs, _device.nvjpeg_library())
    assert overwritten == [0] * len(jpegs), list(zip(sizes, overwritten))
    for (h, w), jpeg, out in zip(sizes, jpegs, outputs, strict=True):
        _, rgb, planes = fastpipe._ext._C._jpeg_ycc_model(jpeg)  # libjpeg's
        want = np.frombuffer(planes, np.uint8) if layout == "planar" else np.asarray(rgb).reshape(-1)
        got = np.frombuffer(out, np.uint8)
        assert got.shape == want.shape, (h, w)
        if layout == "planar" and sampling == "gray":  # Y only: the chroma room is the decoder's to fill or not
            got, want = got[: h * w], want[: h * w]
        if layout == "planar" or sampling in ("444", "gray"):  # interleaved: nvJPEG's own chroma upsampling
            diff = np.abs(got.astype(int) - want.astype(int))
            assert diff.mean() <= 1.0, (sampling, (h, w), layout, diff.mean(), diff.max())


def test_a_failed_lane_allocation_frees_what_was_allocated(folder):
    """The second decode lane's allocation fails: the first lane's buffers are freed (a throwing
    constructor runs no destructor), and so is everything else the loader allocated."""
    t = CenterCrop(24, resize=30, dct_scaling=False)
    with _device.simulated() as sim:
        ld = fastpipe.Loader(folder, batch_size=2, transforms={0: t}, device="cuda", image_decode="device")
        allocations = sim._live_allocations()  # the arena and each lane's decoded images
        del ld
        assert sim._live_allocations() == 0
        for after in range(allocations):
            sim._fail("alloc", 1, after)
            with pytest.raises(RuntimeError, match="alloc failed"):
                fastpipe.Loader(folder, batch_size=2, transforms={0: t}, device="cuda", image_decode="device")
            gc.collect()
            assert sim._live_allocations() == 0, f"allocation {after} failed"


def test_replacing_bad_images_is_refused_with_device_decode(folder):
    """Only the reader threads substitute a bad image: the device path refuses on_error='replace' at
    construction (it used to ignore it and fail the batch), and the host path takes it."""
    t = CenterCrop(24, resize=30, dct_scaling=False)
    with _device.simulated():
        with pytest.raises(ValueError, match="on_error='replace' is not available with image_decode='device'"):
            fastpipe.Loader(folder, batch_size=2, transforms={0: t}, device="cuda", image_decode="device",
                            on_error="replace")
        ld = fastpipe.Loader(folder, batch_size=2, transforms={0: t}, device="cuda", image_decode="host",
                             on_error="replace")
        assert len(list(ld)) == 3
        del ld
