"""Monitor: samples GPU, CPU, memory and data-wait in a background thread while a training loop runs."""

import json
import math
import os
import threading
import time

import torch

# NVML readings, each (sample key, reader(pynvml, handle)); a reading the device refuses is dropped alone.
_GPU_METRICS = (
    ("gpu_busy_pct", lambda nv, h: nv.nvmlDeviceGetUtilizationRates(h).gpu),
    ("gpu_mem", lambda nv, h: nv.nvmlDeviceGetMemoryInfo(h).used),
    ("power", lambda nv, h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),  # NVML reports milliwatts
    ("temp", lambda nv, h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
    ("sm_clock", lambda nv, h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
)
# Loader.stats() counters a sample reads from the watched loaders, counted from when watching began:
# (stats key, sample key); the network ones only while a watched loader reads remote data.
_LOADER_COUNTERS = (("wait_seconds", "data_wait_seconds"), ("network_wait_seconds", "network_wait_seconds"),
                    ("bytes_fetched", "bytes_fetched"))
_NETWORK = {"network_wait_seconds", "bytes_fetched"}
# Rates between samples of those counters: (counter, rate, scale).
_RATES = (("data_wait_seconds", "data_wait_pct", 100.0), ("network_wait_seconds", "network_wait_pct", 100.0),
          ("bytes_fetched", "fetch_mbps", 1e-6))
_JOIN_TIMEOUT = 5.0  # seconds stop() waits for a sample in progress (an NVML call) before giving up on it
_GIB = 1 << 30


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _fmt_bytes(n):
    return f"{n / _GIB:.1f} GiB" if n >= _GIB else f"{n / (1 << 20):.0f} MiB"


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _max(values):
    values = [v for v in values if v is not None]
    return max(values) if values else None


class Monitor:
    """Samples device and host utilisation in a background thread, as a context manager.

    ``with Monitor(loaders=[loader]) as mon: for batch in loader: ...; mon.step()`` then
    ``print(mon)``: "GPU busy 97%, ..., data wait 1.2%, CPU 180%, RSS 1.2 GiB, 500 steps (41.2/s) in 12.1 s".

    Every ``interval`` seconds a sample records, for the process: CPU utilisation (100% per busy core)
    and resident memory; for the watched loaders: the share of the time the training loop waited for
    data and, for remote data (a WebDataset of URLs), the network: the fetch rate and the time reader
    threads waited for a shard to arrive (a stall shows as a rise in it, then in data wait); for the
    GPU, through NVML (``pip install nvidia-ml-py``, optional): utilisation, memory used, power,
    temperature and SM clock. What cannot be measured (no NVML, no GPU, a reading the device
    refuses, an error in the sampler) is skipped and listed in ``summary()["skipped"]``; the training
    loop never sees a sampler error.

    Parameters
    ----------
    interval : float
        Seconds between samples (> 0).
    loaders : iterable of Loader, optional
        Loaders whose data-wait is measured (see also :meth:`watch`).
    device : int, str or torch.device, optional
        The CUDA device whose GPU is sampled; default: the current CUDA device if CUDA is initialised,
        else device 0.

    Notes
    -----
    A sample takes about 20 microseconds (plus NVML's calls, well under a millisecond), so the default
    of 10 samples a second does not show in what it measures.
    A Monitor records one run: starting it a second time raises RuntimeError.
    """

    def __init__(self, interval=0.1, *, loaders=(), device=None):
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not interval > 0:
            raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
        self.interval = float(interval)
        self.device = device
        self._lock = threading.RLock()
        self._samples = []
        self._skipped = []
        self._loaders = []  # [loader, its counters (_LOADER_COUNTERS) when watching began]
        self._remote = False  # a watched loader reads remote data
        self._watched = False
        self._steps = 0
        self._t0 = self._cpu0 = None
        self._thread = None
        self._stop_event = threading.Event()
        self._state = "new"  # -> "running" -> "stopped"
        self._nvml = self._handle = None
        self._gpu_off = set()
        for loader in loaders:
            self.watch(loader)

    # -- control -----------------------------------------------------------------------------------

    def watch(self, loader):
        """Adds a :class:`fastpipe.Loader` whose time blocked in ``next()`` counts as data wait."""
        if not callable(getattr(loader, "stats", None)):
            raise TypeError(f"watch() takes a fastpipe.Loader (it reports its wait time), got {type(loader).__name__}")
        if self._state == "stopped":
            raise RuntimeError("this Monitor has stopped: watch loaders before or while it runs")
        with self._lock:
            self._loaders.append([loader, self._counters(loader) if self._state == "running" else None])
            self._watched = True
            self._remote |= getattr(getattr(loader, "dataset", None), "fetch_stats", None) is not None
        return loader

    @staticmethod
    def _counters(loader):
        stats = loader.stats()
        return {key: stats.get(key, 0) for key, _ in _LOADER_COUNTERS}

    def step(self, n=1):
        """Counts ``n`` training steps (reported as steps and steps per second)."""
        self._steps += n

    def start(self):
        """Starts sampling (``with Monitor() as mon`` calls it); returns the monitor."""
        if self._state != "new":
            raise RuntimeError("this Monitor has already run: a Monitor records one run, create a new one")
        with self._lock:
            for entry in self._loaders:
                entry[1] = self._counters(entry[0])
        self._open_gpu()
        self._state = "running"
        # process_time: user + system time of every thread (the loader's readers too), to the nanosecond
        self._t0, self._cpu0 = time.monotonic(), time.process_time()
        self.sample()
        self._thread = threading.Thread(target=self._run, name="fastpipe-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        """Stops sampling after a last sample; the thread is joined. Does nothing unless running."""
        if self._state != "running":
            return
        self._stop_event.set()
        self._thread.join(_JOIN_TIMEOUT + self.interval)
        stuck = self._thread.is_alive()
        if stuck:  # hung in a reading: another reading would hang too
            self._skip(f"the sampler thread did not stop within {_JOIN_TIMEOUT:.0f} s and was left as a daemon")
        else:
            try:
                self.sample()
            except Exception as e:  # the last sample is a nicety: the samples already taken stand
                self._skip(f"sampler error: {type(e).__name__}: {e}")
            if self._nvml is not None:
                try:
                    self._nvml.nvmlShutdown()
                except Exception:  # noqa: BLE001 - shutting down a library that already failed is not news
                    pass
        self._state = "stopped"
        self._thread = None
        self._nvml = self._handle = None
        with self._lock:
            self._loaders.clear()  # their totals are in the last sample: let the loaders go

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def _run(self):
        while not self._stop_event.wait(self.interval):
            try:
                self.sample()
            except Exception as e:  # a broken reading must not end the monitoring, nor reach the training loop
                self._skip(f"sampler error: {type(e).__name__}: {e}")

    def _skip(self, reason):
        with self._lock:
            if reason not in self._skipped:
                self._skipped.append(reason)

    # -- readings ----------------------------------------------------------------------------------

    def _open_gpu(self):
        try:
            import pynvml
        except ImportError:
            self._skip("no NVML: nvidia-ml-py is not installed (pip install nvidia-ml-py)")
            return
        try:
            pynvml.nvmlInit()
        except Exception as e:  # NVMLError, or OSError from a broken driver library
            self._skip(f"no NVML: {e}")
            return
        try:
            if pynvml.nvmlDeviceGetCount() == 0:
                raise RuntimeError("NVML sees no device")
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self._nvml_index())
            self._nvml = pynvml
        except Exception as e:
            self._skip(f"no GPU: {e}")
            pynvml.nvmlShutdown()

    def _nvml_index(self):
        device = self.device
        if device is None:
            index = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
        elif isinstance(device, int):
            index = device
        else:
            index = torch.device(device).index or 0
        try:  # NVML numbers every GPU of the machine; CUDA only the visible ones
            return torch.cuda._get_nvml_device_index(index)
        except Exception:  # noqa: BLE001 - a private helper of torch's: without it assume the same numbering
            return index

    def _read_gpu(self, sample):
        for key, read in _GPU_METRICS:
            value = None
            if key not in self._gpu_off:
                try:
                    value = read(self._nvml, self._handle)
                except Exception as e:  # e.g. power on a GPU without a sensor: that reading alone is dropped
                    self._gpu_off.add(key)
                    self._skip(f"no {key}: {e}")
            sample[key] = value

    def sample(self):
        """Takes a sample now (the thread takes one every ``interval``) and returns it.

        A sample is a dict: ``t`` (seconds since start), ``time`` (Unix time), ``cpu_seconds``
        (process CPU time since start), ``cpu_pct`` (since the previous sample), ``rss`` (bytes),
        ``steps``; with watched loaders ``data_wait_seconds`` (since start) and ``data_wait_pct``, and
        when one reads remote data ``network_wait_seconds`` (reader threads waiting for shards, summed
        over them, since start), ``network_wait_pct`` (100 per reader thread waiting throughout),
        ``bytes_fetched`` (since start) and ``fetch_mbps`` (MB/s since the previous sample); with NVML
        ``gpu_busy_pct``, ``gpu_mem`` (bytes), ``power`` (W), ``temp`` (C), ``sm_clock`` (MHz).
        """
        if self._state != "running":
            raise RuntimeError("the Monitor is not running")
        s = {}
        if self._nvml is not None:
            self._read_gpu(s)  # outside the lock: a hung NVML call must not block stop()
        try:
            rss = _rss_bytes()
        except OSError as e:  # no /proc (not Linux)
            rss = None
            self._skip(f"no RSS: {e}")
        with self._lock:
            s.update(t=time.monotonic() - self._t0, time=time.time(), cpu_seconds=time.process_time() - self._cpu0,
                     cpu_pct=None, rss=rss, steps=self._steps)
            if self._watched:
                keys = [k for k in _LOADER_COUNTERS if self._remote or k[1] not in _NETWORK]
                try:
                    counted = [(self._counters(ld), base) for ld, base in self._loaders]
                    for key, name in keys:
                        s[name] = sum(c[key] - base[key] for c, base in counted)
                except Exception as e:  # the other readings stand
                    for _, name in keys:
                        s[name] = None
                    self._skip(f"no data wait: {type(e).__name__}: {e}")
                s["data_wait_pct"] = None
                if self._remote:
                    s["network_wait_pct"] = s["fetch_mbps"] = None
            if self._samples:
                prev = self._samples[-1]
                dt = s["t"] - prev["t"]
                if dt > 0:
                    s["cpu_pct"] = 100.0 * (s["cpu_seconds"] - prev["cpu_seconds"]) / dt
                    for name, rate, scale in _RATES:
                        value, before = s.get(name), prev.get(name, 0.0)
                        if rate in s and value is not None and before is not None:
                            s[rate] = scale * (value - before) / dt
            self._samples.append(s)
            return dict(s)

    # -- results -----------------------------------------------------------------------------------

    @property
    def samples(self):
        """The timeline: a list of sample dicts (see :meth:`sample`), oldest first."""
        with self._lock:
            return [dict(s) for s in self._samples]

    def summary(self):
        """The run in numbers: a dict.

        gpu_busy_pct, gpu_mem_max (bytes), power_mean (W), temp_max (C), sm_clock_mean (MHz): None
        without NVML; cpu_pct (process CPU time / wall time, 100 per core); rss_max (bytes);
        data_wait_pct (loader wait / wall time, None without watched loaders); network_wait_pct and
        fetch_mbps (remote data: reader threads' wait for shards / wall time, bytes fetched / wall time;
        None otherwise); steps, steps_per_s;
        duration (s); skipped (reasons, as strings). While running, it covers the samples so far.
        """
        samples = self.samples
        if not samples:
            raise RuntimeError("the Monitor has not started: use it as a context manager, or call start()")
        first, last = samples[0], samples[-1]
        duration = last["t"] - first["t"]

        def rate(value):
            return 100.0 * value / duration if value is not None and duration > 0 else None

        def col(key):
            return [s.get(key) for s in samples]

        return {
            "gpu_busy_pct": _mean(col("gpu_busy_pct")),
            "gpu_mem_max": _max(col("gpu_mem")),
            "power_mean": _mean(col("power")),
            "temp_max": _max(col("temp")),
            "sm_clock_mean": _mean(col("sm_clock")),
            "cpu_pct": rate(last["cpu_seconds"]),
            "rss_max": _max(col("rss")),
            "data_wait_pct": rate(last.get("data_wait_seconds")),
            "network_wait_pct": rate(last.get("network_wait_seconds")),
            "fetch_mbps": last["bytes_fetched"] / 1e6 / duration if last.get("bytes_fetched") is not None
            and duration > 0 else None,
            "steps": last["steps"],
            "steps_per_s": last["steps"] / duration if duration > 0 else None,
            "duration": duration,
            "skipped": list(self._skipped),
        }

    def report(self):
        """The summary as one line: "GPU busy 97%, data wait 1.2%, CPU 180%, RSS 1.2 GiB, ..."."""
        if not self._samples:
            return "Monitor (not started)"
        s = self.summary()
        formats = (("gpu_busy_pct", "GPU busy {:.0f}%".format), ("gpu_mem_max", lambda v: f"GPU mem {_fmt_bytes(v)}"),
                   ("power_mean", "{:.0f} W".format), ("temp_max", "{:.0f} C".format),
                   ("sm_clock_mean", "SM {:.0f} MHz".format), ("data_wait_pct", "data wait {:.1f}%".format),
                   ("network_wait_pct", "network wait {:.1f}%".format), ("fetch_mbps", "fetch {:.0f} MB/s".format),
                   ("cpu_pct", "CPU {:.0f}%".format), ("rss_max", lambda v: f"RSS {_fmt_bytes(v)}"))
        parts = [fmt(s[key]) for key, fmt in formats if s[key] is not None]
        steps = f"{s['steps']} steps ({s['steps_per_s']:.1f}/s) in " if s["steps"] and s["steps_per_s"] else ""
        parts.append(f"{steps}{s['duration']:.1f} s")
        line = ", ".join(parts)
        if s["skipped"]:
            line += f" (skipped: {'; '.join(s['skipped'])})"
        return line

    __str__ = report

    def to_dict(self):
        """``{"interval", "summary", "samples"}``, JSON-serialisable."""
        return {"interval": self.interval, "summary": self.summary(), "samples": self.samples}

    def to_json(self, **kwargs):
        """:meth:`to_dict` as a JSON string (``kwargs`` go to ``json.dumps``, e.g. ``indent=2``)."""
        return json.dumps(self.to_dict(), **kwargs)

    def save_plot(self, path, title=None):
        """Writes the timeline as an image (PNG unless ``path`` names another format); returns ``path``.

        Needs matplotlib (``pip install matplotlib``); it is drawn without pyplot, so the program's
        matplotlib backend is left alone.
        """
        try:
            from matplotlib.figure import Figure
        except ImportError as e:
            raise ImportError("Monitor.save_plot needs matplotlib: pip install matplotlib") from e
        samples = self.samples
        if not samples:
            raise RuntimeError("the Monitor has no samples to plot: it has not started")
        t = [s["t"] for s in samples]
        panels = [  # (y label, [(sample key, legend, scale)])
            ("%", [("gpu_busy_pct", "GPU busy", 1), ("cpu_pct", "CPU (100 per core)", 1),
                   ("data_wait_pct", "data wait", 1), ("network_wait_pct", "readers' network wait", 1)]),
            ("MB/s", [("fetch_mbps", "fetched", 1)]),
            ("GiB", [("rss", "RSS", 1 / _GIB), ("gpu_mem", "GPU memory", 1 / _GIB)]),
            ("W", [("power", "GPU power", 1)]),
            ("C", [("temp", "GPU temperature", 1)]),
            ("MHz", [("sm_clock", "SM clock", 1)]),
        ]
        panels = [(label, [c for c in curves if any(s.get(c[0]) is not None for s in samples)])
                  for label, curves in panels]
        panels = [p for p in panels if p[1]]
        fig = Figure(figsize=(10, 2.2 * len(panels) + 0.6), layout="constrained")
        axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
        for ax, (label, curves) in zip(axes, panels):
            for key, legend, scale in curves:
                ax.plot(t, [math.nan if s.get(key) is None else s[key] * scale for s in samples], label=legend)
            ax.set_ylabel(label)
            ax.grid(True, alpha=0.3)
            ax.legend(loc="upper left", fontsize="small")
        axes[-1].set_xlabel("seconds")
        fig.suptitle(title or self.report(), fontsize="small")
        fig.savefig(path, dpi=100)
        return path
