"""Monitor: samples and their clocks, CPU and RSS readings, a Loader's data-wait, NVML (missing, faked,
real on a GPU), the sampler thread's lifetime and errors, reports, plots; and the Loader's profiler range.

No test sleeps: the ones that need the sampler thread to have sampled keep the CPU busy until it has
(bounded by HANG, a hang), and the rest take their samples with ``Monitor.sample()``.
"""

import json
import mmap
import os
import sys
import threading
import time
import types

import pytest
import torch

import fastpipe
from fastpipe.monitor import Monitor

pytestmark = pytest.mark.timeout(60)

HANG = 30.0
MiB = 1 << 20


def busy_until(cond):
    """Burns CPU until cond() holds (fails the test after HANG seconds)."""
    deadline = time.monotonic() + HANG
    while not cond():
        sum(range(1000))
        assert time.monotonic() < deadline, "hang: the condition never held"


def skipped_beyond_gpu(mon):
    """The summary's skipped reasons other than the machine's own (no NVML, no GPU)."""
    return [r for r in mon.summary()["skipped"] if not r.startswith(("no NVML", "no GPU"))]


def monitor_threads():
    return [t for t in threading.enumerate() if t.name == "fastpipe-monitor"]


def test_exported():
    assert fastpipe.Monitor is fastpipe.monitor.Monitor is Monitor


def test_samples_cpu_steps_and_thread_lifetime():
    with Monitor(interval=0.005) as mon:
        assert len(monitor_threads()) == 1
        for _ in range(7):
            mon.step()
        busy_until(lambda: len(mon.samples) >= 5)  # the thread samples on its own
    assert monitor_threads() == []
    samples = mon.samples
    t = [s["t"] for s in samples]
    assert t == sorted(t) and len(set(t)) == len(t), "timestamps must increase"
    assert [s["time"] for s in samples] == sorted(s["time"] for s in samples)
    s = mon.summary()
    assert s["steps"] == 7 and samples[-1]["steps"] == 7
    assert s["duration"] == pytest.approx(t[-1] - t[0])
    ncpu = os.cpu_count()
    assert 0 < s["cpu_pct"] <= 100 * ncpu + 50
    assert all(x["cpu_pct"] >= 0 for x in samples[1:])
    assert samples[0]["cpu_pct"] is None  # no previous sample to compare with
    assert s["rss_max"] > 10 * MiB
    assert s["data_wait_pct"] is None, "no loader was watched"
    assert "CPU " in str(mon) and "7 steps" in mon.report()


def test_rss_grows_with_fresh_pages():
    # A fresh anonymous mapping: an allocator may hand a big tensor pages that are already resident (freed
    # by an earlier test and kept), and RSS then rightly does not move.
    size = 64 * MiB
    with Monitor() as mon, mmap.mmap(-1, size) as pages:
        before = mon.sample()["rss"]
        for offset in range(0, size, mmap.PAGESIZE):
            pages[offset] = 1
        after = mon.sample()["rss"]
    assert after - before >= 48 * MiB
    assert mon.summary()["rss_max"] >= after


def test_data_wait_of_a_loader(dataset_factory, fp):
    ds, _, _ = dataset_factory(2000, {"x": ("float32", (64,))})
    with fp.loader(ds, 50) as ld:
        with Monitor(loaders=[ld]) as mon:
            w0 = ld.stats()["wait_seconds"]
            for batch in ld:
                mon.step()
            w1 = ld.stats()["wait_seconds"]
        s = mon.summary()
        assert 0 <= s["data_wait_pct"] <= 100
        assert mon.samples[-1]["data_wait_seconds"] == pytest.approx(w1 - w0, abs=1e-9)
        assert s["data_wait_pct"] == pytest.approx(100 * (w1 - w0) / s["duration"])
        assert s["steps"] == len(ld)
        assert "data wait" in str(mon)

        with Monitor() as late:
            for batch in ld:  # an epoch before watching: not counted
                pass
            late.watch(ld)
            w0 = ld.stats()["wait_seconds"]
            for batch in ld:
                pass
            w1 = ld.stats()["wait_seconds"]
        assert late.samples[-1]["data_wait_seconds"] == pytest.approx(w1 - w0, abs=1e-9)
        assert 0 <= late.summary()["data_wait_pct"] <= 100


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the report of a machine without a GPU")
def test_no_gpu_is_skipped_and_said():
    with Monitor() as mon:
        pass
    s = mon.summary()
    assert s["gpu_busy_pct"] is None and s["gpu_mem_max"] is None and s["power_mean"] is None
    assert any("NVML" in r or "GPU" in r for r in s["skipped"]), s["skipped"]
    assert "(skipped: " in str(mon)


def test_without_nvidia_ml_py(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    with Monitor() as mon:
        pass
    assert any("pip install nvidia-ml-py" in r for r in mon.summary()["skipped"])


class _NotSupported(Exception):
    pass


def _fake_nvml(calls):
    def refuse(handle):
        raise _NotSupported("Not Supported")

    return types.SimpleNamespace(
        NVML_TEMPERATURE_GPU=0, NVML_CLOCK_SM=1,
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: ("handle", i),
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=97, memory=40),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=3 << 30, total=80 << 30),
        nvmlDeviceGetPowerUsage=refuse,
        nvmlDeviceGetTemperature=lambda h, kind: 61,
        nvmlDeviceGetClockInfo=lambda h, kind: 1980,
    )


def test_gpu_metrics_through_nvml(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(calls))
    with Monitor(device=0) as mon:
        mon.sample()
    s = mon.summary()
    assert s["gpu_busy_pct"] == 97 and s["gpu_mem_max"] == 3 << 30
    assert s["temp_max"] == 61 and s["sm_clock_mean"] == 1980
    assert s["power_mean"] is None and s["skipped"] == ["no power: Not Supported"]  # the others stay
    assert calls == ["init", "shutdown"]
    line = str(mon)
    assert line.startswith("GPU busy 97%, GPU mem 3.0 GiB, 61 C, SM 1980 MHz, CPU ")
    assert "no power" in line


def test_nvml_without_device(monkeypatch):
    calls = []
    fake = _fake_nvml(calls)
    fake.nvmlDeviceGetCount = lambda: 0
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with Monitor() as mon:
        pass
    assert mon.summary()["skipped"] == ["no GPU: NVML sees no device"]
    assert calls == ["init", "shutdown"]


class _BrokenLoader:
    """Reports its wait once (when watching starts), then fails."""

    def __init__(self):
        self.calls = 0

    def stats(self):
        self.calls += 1
        if self.calls > 1:
            raise RuntimeError("boom")
        return {"wait_seconds": 0.0}


def test_unreadable_loader_drops_data_wait_only():
    with Monitor(loaders=[_BrokenLoader()]) as mon:
        mon.sample()
    assert skipped_beyond_gpu(mon) == ["no data wait: RuntimeError: boom"]
    s = mon.summary()
    assert s["data_wait_pct"] is None and s["cpu_pct"] is not None and s["rss_max"] > 0


def test_sampler_errors_are_recorded_not_raised(monkeypatch):
    def broken():
        raise ValueError("bad reading")

    with Monitor(interval=0.005) as mon:
        monkeypatch.setattr(fastpipe.monitor, "_rss_bytes", broken)
        busy_until(lambda: skipped_beyond_gpu(mon))  # the thread met the error and goes on
        n = len(mon.samples)
        monkeypatch.undo()
        busy_until(lambda: len(mon.samples) > n)
    assert monitor_threads() == []
    assert skipped_beyond_gpu(mon) == ["sampler error: ValueError: bad reading"]


def test_exception_in_body_stops_thread_and_propagates():
    with pytest.raises(ZeroDivisionError):
        with Monitor(interval=0.005) as mon:
            assert monitor_threads()
            1 / 0
    assert monitor_threads() == []
    assert mon.summary()["duration"] >= 0


def test_one_run_per_monitor_and_bad_arguments():
    mon = Monitor()
    with pytest.raises(RuntimeError, match="not started"):
        mon.summary()
    assert str(mon) == "Monitor (not started)"
    with mon:
        with pytest.raises(RuntimeError, match="already run"):
            mon.start()
    with pytest.raises(RuntimeError, match="already run"):
        with mon:
            pass
    with pytest.raises(RuntimeError, match="not running"):
        mon.sample()
    with pytest.raises(RuntimeError, match="stopped"):
        mon.watch(_BrokenLoader())
    mon.stop()  # stopping again does nothing
    assert monitor_threads() == []
    for bad in (0, -1, float("nan"), True, "0.1"):
        with pytest.raises(ValueError, match="interval"):
            Monitor(interval=bad)
    with pytest.raises(TypeError, match="fastpipe.Loader"):
        Monitor(loaders=[object()])


def test_to_json():
    with Monitor() as mon:
        mon.step(3)
    d = json.loads(mon.to_json())
    assert d["summary"]["steps"] == 3 and d["interval"] == 0.1
    assert len(d["samples"]) == len(mon.samples) >= 2


def test_save_plot(tmp_path):
    pytest.importorskip("matplotlib")
    with Monitor() as mon:
        mon.sample()
    path = tmp_path / "timeline.png"
    assert mon.save_plot(path) == path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_save_plot_without_matplotlib(monkeypatch, tmp_path):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)
    with Monitor() as mon:
        pass
    with pytest.raises(ImportError, match="pip install matplotlib"):
        mon.save_plot(tmp_path / "timeline.png")
    assert not (tmp_path / "timeline.png").exists()


def test_loader_next_is_a_profiler_range(dataset_factory, fp):
    ds, _, _ = dataset_factory(300, {"x": ("uint8", (16,))})
    with fp.loader(ds, 100) as ld:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            n = sum(1 for _ in ld)
    ranges = [e for e in prof.events() if e.name == "fastpipe::loader.next"]
    assert n == 3 and len(ranges) == n + 1  # the last next() ends the epoch


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_metrics_on_a_gpu():
    pytest.importorskip("pynvml")
    x = torch.randn(4096, 4096, device="cuda")
    with Monitor(interval=0.01) as mon:
        busy_until(lambda: (x @ x).sum().item() is not None and len(mon.samples) >= 5)
    s = mon.summary()
    assert s["skipped"] == [] or all("no power" in r or "no temp" in r for r in s["skipped"]), s["skipped"]
    assert 0 <= s["gpu_busy_pct"] <= 100
    assert s["gpu_mem_max"] >= 64 * MiB
    assert "GPU busy" in str(mon)
