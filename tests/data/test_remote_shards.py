"""Shards read from S3 and HTTP (fastpipe/data/remote.py, csrc/core/http_fetch.cpp, shard_cache.cpp)
against servers these tests start on 127.0.0.1: moto's S3 server (which checks every signature), nginx,
and a scripted server injecting faults. The reference is the same shards read from local disk, and the
objects' own bytes."""

import _thread
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest

import fastpipe
from fastpipe._ext import _C
from fastpipe.data import remote
from fastpipe.transforms import RandomResizedCrop

from jpegs import jpeg_bytes, picture
from servers import FAST, nginx
from tar_files import tar_bytes

pytestmark = [pytest.mark.timeout(180, method="thread"),
              pytest.mark.skipif(not _C.HTTP_AVAILABLE, reason="built without libcurl (`make setup` installs it)")]


def make_shards(rng, count, samples):
    """`count` tar shards of `samples` JPEG samples each (random sizes, labels; a member of noise makes
    each shard several ranged GETs): [(name, bytes)]."""
    out, n = [], 0
    for k in range(count):
        members = []
        for _ in range(samples):
            h, w = (int(v) for v in rng.integers(20, 70, 2))
            members += [(f"s{n:05d}.jpg", jpeg_bytes(picture(rng, h, w))), (f"s{n:05d}.cls", str(int(rng.integers(0, 7))).encode()),
                        (f"s{n:05d}.pad", rng.bytes(int(rng.integers(10_000, 40_000))))]
            n += 1
        out.append((f"train-{k:03d}.tar", tar_bytes(members)))
    return out


def batches(ds, **kw):
    ld = fastpipe.Loader(ds, batch_size=4, transforms={0: RandomResizedCrop(24, dct_scaling=False)}, timeout=60, **kw)
    return [(x.numpy().copy(), y.numpy().copy()) for x, y in ld]


def same_dataset(a, b):
    assert len(a) == len(b) and [a.key(i) for i in range(len(a))] == [b.key(i) for i in range(len(b))]
    assert a.targets == b.targets
    for kw in (dict(shuffle=True, seed=9), dict(shuffle=False)):
        for (x, y), (rx, ry) in zip(batches(a, **kw), batches(b, **kw), strict=True):
            np.testing.assert_array_equal(y, ry)
            np.testing.assert_array_equal(x, rx)


def test_s3_http_and_local_shards_give_the_same_batches(s3, tmp_path, rng):
    shards = make_shards(rng, 3, 5)
    served = tmp_path / "served"
    served.mkdir()
    for name, data in shards:
        (served / name).write_bytes(data)
        s3.put("data", f"sets/one/{name}", data)
    local = fastpipe.WebDataset(str(served / "train-{000..002}.tar"))
    from_s3 = fastpipe.WebDataset("s3://data/sets/one/train-{000..002}.tar", storage_options=s3.options(**FAST),
                                  cache_dir=tmp_path / "cache-s3")
    with nginx(served, tmp_path / "nginx") as server:
        from_http = fastpipe.WebDataset(server.url + "/train-{000..002}.tar", storage_options=FAST,
                                        cache_dir=tmp_path / "cache-http")
    total = sum(len(d) for _, d in shards)
    for ds in (from_s3, from_http):
        assert ds.fetch_stats["shards_fetched"] == 3 and ds.fetch_stats["bytes_fetched"] == total
        ld = fastpipe.Loader(ds, batch_size=4, transforms={0: RandomResizedCrop(24)})
        s = ld.stats()
        assert (s["bytes_fetched"], s["fetch_requests"], s["cache_hits"]) == (total, ds.fetch_stats["requests"], 0)
        ld.close()
        assert ds.fetch_stats["requests"] > 3 + 3  # HEADs, then more than one ranged GET a shard
        same_dataset(ds, local)
    assert from_s3.urls[0] == "s3://data/sets/one/train-000.tar"
    assert "3 shards under 's3://data/sets/one'" in repr(from_s3)
    # A second dataset finds its index kept and its shards in the cache, in the same version: nothing
    # is fetched, at construction (HEADs only) or in its two passes (each shard a cache hit in each).
    again = fastpipe.WebDataset("s3://data/sets/one/train-{000..002}.tar", storage_options=s3.options(),
                                cache_dir=tmp_path / "cache-s3")
    same_dataset(again, local)
    assert again.fetch_stats["cache_hits"] == 2 * 3 and again.fetch_stats["bytes_fetched"] == 0
    assert again.fetch_stats["requests"] == 3


def test_an_index_copied_from_the_node_that_built_it_spares_fetching_the_shards(faulty, tmp_path, rng):
    """The index's folder is named by the shards (URL, ETag, size) and settings, not by the machine or the
    cache: another node given a copy constructs with HEADs only, and reads the same dataset."""
    shards = make_shards(rng, 3, 4)
    urls = [faulty.put(f"/sets/{name}", data) for name, data in shards]
    built = fastpipe.WebDataset(urls, storage_options=FAST, cache_dir=tmp_path / "a" / "cache",
                                index_cache=tmp_path / "a" / "index")
    assert built.fetch_stats["bytes_fetched"] == sum(len(d) for _, d in shards)
    shutil.copytree(tmp_path / "a" / "index", tmp_path / "b" / "index")
    other = fastpipe.WebDataset(urls, storage_options=FAST, cache_dir=tmp_path / "b" / "cache",
                                index_cache=tmp_path / "b" / "index")
    assert (other.fetch_stats["bytes_fetched"], other.fetch_stats["requests"]) == (0, 3)  # a HEAD a shard
    local = tmp_path / "local"
    local.mkdir()
    for name, data in shards:
        (local / name).write_bytes(data)
    same_dataset(other, fastpipe.WebDataset([str(local / name) for name, _ in shards], index_cache="off"))


def test_an_index_published_beside_the_shards_is_read_instead_of_the_shards(faulty, tmp_path, rng):
    """index_cache as a URL: with no index there, the first machine builds it, keeps it locally and, where
    the server takes no upload (405, as nginx answers a PUT), says why and which folder to upload; once
    uploaded, a fresh machine reads it and fetches no shard to construct."""
    shards = make_shards(rng, 3, 4)
    urls = [faulty.put(f"/sets/{name}", data) for name, data in shards]
    published = faulty.url + "/indexes"
    with pytest.warns(UserWarning, match=r"no index at '.*/indexes/[0-9a-f]{20}/': built here and kept in '.*', "
                                         r"but uploading it failed \(.*HTTP 405") as said:
        first = fastpipe.WebDataset(urls, storage_options=FAST, cache_dir=tmp_path / "a", index_cache=published)
    assert first.fetch_stats["bytes_fetched"] == sum(len(d) for _, d in shards)
    where, folder = re.search(r"no index at '(.*?)': built here and kept in '(.*?)'", str(said[0].message)).groups()
    for f in ("index.json", "index.npz"):
        faulty.put(where[len(faulty.url):] + f, open(os.path.join(folder, f), "rb").read())
    other = fastpipe.WebDataset(urls, storage_options=FAST, cache_dir=tmp_path / "b", index_cache=published)
    assert (other.fetch_stats["bytes_fetched"], other.fetch_stats["shards_fetched"]) == (0, 0)
    local = tmp_path / "local"
    local.mkdir()
    for name, data in shards:
        (local / name).write_bytes(data)
    same_dataset(other, fastpipe.WebDataset([str(local / name) for name, _ in shards], index_cache="off"))
    # An index there that is not these shards' (damaged here) is an error naming it, never used.
    faulty.put(where[len(faulty.url):] + "index.json", b'{"key": "another dataset", "reasons": []}')
    with pytest.raises(ValueError, match=rf"index_cache: the index at '{re.escape(where)}' is not these shards'"):
        fastpipe.WebDataset(urls, storage_options=FAST, cache_dir=tmp_path / "c", index_cache=published)
    with pytest.raises(ValueError, match="index_cache: a URL .* holds indexes of remote shards only"):
        fastpipe.WebDataset([str(local / name) for name, _ in shards], index_cache=published)


def test_an_index_is_uploaded_where_the_server_takes_it_and_read_there(faulty, tmp_path, rng):
    """With no index at the index_cache URL and a server that takes PUTs, the first machine uploads the
    one it built (a 503 retried), index.npz before index.json (a reader finds a whole index or none), and
    says nothing; a fresh machine then reads it and fetches no shard to construct."""
    shards = make_shards(rng, 3, 4)
    urls = [faulty.put(f"/up/{name}", data) for name, data in shards]
    faulty.writable = True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = fastpipe.WebDataset(urls, storage_options=FAST, cache_dir=tmp_path / "a",
                                    index_cache=faulty.url + "/indexes")
    puts = [(m, p) for m, p, _ in faulty.log if m == "PUT"]
    assert [p.rsplit("/", 1)[1] for _, p in puts] == ["index.npz", "index.json"]
    assert all(re.fullmatch(r"/indexes/[0-9a-f]{20}/index\.(npz|json)", p) for _, p in puts)
    assert json.loads(faulty.objects[puts[1][1]])["key"]  # the index's own files, as a local cache keeps them
    faulty.writable = False  # a reader needs none
    other = fastpipe.WebDataset(urls, storage_options=FAST, cache_dir=tmp_path / "b", index_cache=faulty.url + "/indexes")
    assert (other.fetch_stats["bytes_fetched"], other.fetch_stats["shards_fetched"]) == (0, 0)
    same_dataset(other, first)
    # A 503 on an upload is retried, as a fetch's is.
    more = make_shards(rng, 2, 3)
    urls = [faulty.put(f"/up2/{name}", data) for name, data in more]
    faulty.writable = True
    faulty.put_faults = ["503"]
    fastpipe.WebDataset(urls, storage_options=FAST, cache_dir=tmp_path / "c", index_cache=faulty.url + "/idx2")
    uploaded = [p for m, p, _ in faulty.log if m == "PUT" and p.startswith("/idx2/")]
    assert len(uploaded) == 3 and uploaded[0] == uploaded[1] and uploaded[0].endswith("index.npz")


def test_an_index_published_in_s3_is_read_with_the_datasets_signed_requests(s3, tmp_path, rng):
    """The first machine uploads the index it built with the dataset's signed requests (moto checks
    their signatures; test_remote_signing the body's hash against botocore's); a fresh machine reads it
    there."""
    shards = make_shards(rng, 2, 3)
    urls = [s3.put("data", f"pub/{name}", data) for name, data in shards]
    opts = dict(storage_options=s3.options(), index_cache="s3://data/pub-indexes")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = fastpipe.WebDataset(urls, cache_dir=tmp_path / "a", **opts)
    other = fastpipe.WebDataset(urls, cache_dir=tmp_path / "b", **opts)
    assert (other.fetch_stats["bytes_fetched"], other.fetch_stats["shards_fetched"]) == (0, 0)
    assert [other.key(i) for i in range(len(other))] == [first.key(i) for i in range(len(first))]
    assert other.targets == first.targets


def test_the_default_cache_is_made_with_its_parents_on_a_fresh_machine(faulty, tmp_path, rng, monkeypatch):
    monkeypatch.delenv("FASTPIPE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "fresh" / "cache"))  # none of it exists yet
    shards = make_shards(rng, 2, 3)
    urls = [faulty.put(f"/fresh/{name}", data) for name, data in shards]
    assert len(fastpipe.WebDataset(urls, storage_options=FAST, index_cache=tmp_path / "index")) == 6
    folder = tmp_path / "fresh" / "cache" / "fastpipe" / "shards"
    assert sorted(p.read_bytes() for p in folder.iterdir() if not p.name.startswith(".")) == \
        sorted(d for _, d in shards)


def test_an_object_replaced_on_the_server_is_a_new_cache_file(s3, tmp_path, rng):
    (name, first), = make_shards(rng, 1, 3)
    (_, second), = make_shards(rng, 1, 4)
    url = s3.put("data", f"replaced/{name}", first)
    opts = dict(storage_options=s3.options(), cache_dir=tmp_path / "cache")
    assert len(fastpipe.WebDataset(url, **opts)) == 3
    s3.put("data", f"replaced/{name}", second)
    ds = fastpipe.WebDataset(url, **opts)
    assert len(ds) == 4 and ds.fetch_stats["shards_fetched"] == 1
    assert sorted(p.read_bytes() for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")) == \
        sorted([first, second])


def test_credentials_are_found_as_botocore_finds_them(s3, tmp_path, rng, monkeypatch):
    (name, data), = make_shards(rng, 1, 2)
    url = s3.put("data", f"chain/{name}", data)
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.aws of this machine's

    def staged(options=None):
        return remote.stage([url], options, tmp_path / f"cache-{time.monotonic_ns()}")[1]["shards_fetched"]

    with pytest.raises(ValueError, match="no AWS credentials for s3:// URLs"):
        staged({"endpoint_url": s3.endpoint})
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    assert staged() == 1
    # Options before the environment: a wrong secret there is used, and refused by the server.
    # PermissionError, as for a local file one may not read (and s3fs's for a 403).
    with pytest.raises(PermissionError, match=rf"'{url}': HTTP 403, access denied"):
        staged({"key": s3.key, "secret": "wrong"})
    with pytest.raises(PermissionError, match=rf"'{url}': HTTP 403"):
        staged({"anon": True})
    # A profile in the shared files, its endpoint and region in the config file.
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k)
    (tmp_path / "creds").write_text(f"[team]\naws_access_key_id = {s3.key}\naws_secret_access_key = {s3.secret}\n")
    (tmp_path / "config").write_text(f"[profile team]\nregion = eu-west-3\nendpoint_url = {s3.endpoint}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "creds"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_PROFILE", "team")
    assert remote.S3Settings({}).region == "eu-west-3"
    assert staged() == 1
    monkeypatch.setenv("AWS_PROFILE", "nobody")
    with pytest.raises(ValueError, match="the AWS profile 'nobody' is in neither"):
        staged()
    assert staged({"profile": "team"}) == 1


def test_errors_name_the_url(s3, faulty, tmp_path, rng):
    opts = dict(storage_options=s3.options(), cache_dir=tmp_path / "cache")
    # FileNotFoundError, as for a missing local file (and s3fs's for a 404).
    with pytest.raises(FileNotFoundError, match=r"'s3://data/nothing-here.tar': HTTP 404, not found"):
        fastpipe.WebDataset("s3://data/nothing-here.tar", **opts)
    with pytest.raises(FileNotFoundError, match=rf"'{faulty.url}/nothing-here.tar': HTTP 404"):
        fastpipe.WebDataset(faulty.url + "/nothing-here.tar", cache_dir=tmp_path / "cache")
    broken = s3.put("data", "broken.tar", b"x" * 1024)
    with pytest.raises(ValueError, match=r"'s3://data/broken.tar' \(cached as '.*broken.tar'\) is not a valid tar archive"):
        fastpipe.WebDataset(broken, **opts)
    with pytest.raises(ValueError, match="cannot be mixed"):
        fastpipe.WebDataset([broken, faulty.url + "/x.tar"], **opts)
    with pytest.raises(ValueError, match="remote URLs and local paths cannot be mixed"):
        fastpipe.WebDataset([broken, str(tmp_path / "x.tar")], **opts)
    with pytest.raises(ValueError, match="only s3://, http:// and https://"):
        fastpipe.WebDataset("gs://bucket/x.tar")
    with pytest.raises(TypeError, match="storage_options: unknown setting 'endpoint'"):
        fastpipe.WebDataset(broken, storage_options={"endpoint": "x"})
    with pytest.raises(ValueError, match="apply to remote URLs"):
        fastpipe.WebDataset(str(tmp_path / "x.tar"), cache_dir=tmp_path)
    with pytest.raises(ValueError, match="cache_limit must be bytes"):
        fastpipe.WebDataset(broken, cache_limit="lots", **opts)
    with pytest.raises(ValueError, match="part_size must be at least 64 KiB"):
        fastpipe.WebDataset(broken, storage_options=s3.options(part_size=100))
    url = faulty.put("/always-503.tar", rng.bytes(1000), faults=["503"] * 3)
    with pytest.raises(OSError, match=rf"'{url}': HTTP 503, the server kept failing \(3 attempts\)") as failed:
        remote.stage([url], dict(max_attempts=3, retry_backoff=0.01), tmp_path / "c503")
    assert type(failed.value) is OSError  # neither missing nor refused: no subclass
    assert len(faulty.gets("/always-503.tar")) == 3
    url = faulty.put("/unsaid.tar", rng.bytes(1000), faults=["no_content_range"])
    with pytest.raises(OSError, match=rf"'{url}': the server answered a range request with 206 but no Content-Range"):
        remote.stage([url], {}, tmp_path / "c206")
    assert not [p for p in (tmp_path / "c503").iterdir() if ".part-" in p.name]  # nothing left half-written


@pytest.mark.parametrize("fault", ["503", "truncate", "reset", "ignore_range", "stall"])
def test_faults_are_retried_and_resumed_with_the_same_bytes(faulty, tmp_path, rng, fault):
    data = rng.bytes(int(rng.integers(300_000, 400_000)))
    faults = ["ok", fault, fault, "ok"]  # the second and third GETs fail
    url = faulty.put("/shard.tar", data, faults=faults)
    path, stats = remote.stage([url], dict(FAST, max_in_flight=1, stall_timeout=1), tmp_path / "cache")
    assert open(path[0], "rb").read() == data
    # Two failed GETs, retried (a reset of a reused connection curl retries itself, once); a server that
    # ignores Range fails nothing: the part's bytes are taken from the whole body.
    failed = 0 if fault == "ignore_range" else 2
    assert stats["retries"] == failed or (fault == "reset" and stats["retries"] == 1)
    assert stats["bytes_fetched"] >= len(data)
    ranges = faulty.gets("/shard.tar")
    assert len(ranges) == -(-len(data) // (64 << 10)) + failed
    if fault == "truncate":  # each retry asks for the rest of its part only: it starts inside the part
        part = 64 << 10
        resumed = [tuple(int(v) for v in r.split("=")[1].split("-")) for r in ranges]
        resumed = [(a, b) for a, b in resumed if a % part]
        assert len(resumed) == 2
        assert all(b == min((a // part + 1) * part, len(data)) - 1 for a, b in resumed)


def test_an_object_changed_while_it_is_fetched_is_never_mixed(faulty, tmp_path, rng):
    data, changed = rng.bytes(200_000), rng.bytes(200_000)
    url = faulty.put("/moving.tar", data, faults=["ok", "replace:" + changed.hex()])
    with pytest.raises(OSError, match=rf"'{url}': HTTP 412, changed on the server while it was being fetched"):
        remote.stage([url], dict(FAST, max_in_flight=1), tmp_path / "cache")
    assert os.listdir(tmp_path / "cache") == [] or all(n.endswith(".lock") for n in os.listdir(tmp_path / "cache"))
    path, _ = remote.stage([url], FAST, tmp_path / "cache")  # its new version, whole
    assert open(path[0], "rb").read() == changed


def test_the_cache_limit_evicts_the_least_recently_staged(faulty, tmp_path, rng):
    blobs = {f"/{k}.tar": rng.bytes(100_000) for k in range(4)}
    urls = [faulty.put(p, d) for p, d in blobs.items()]
    cache = tmp_path / "cache"
    remote.stage(urls[:2], FAST, cache, cache_limit=250_000)
    remote.stage(urls[:1], FAST, cache, cache_limit=250_000)  # 0 is now the most recently staged
    _, stats = remote.stage(urls[2:3], FAST, cache, cache_limit=250_000)
    assert stats["evicted_bytes"] == 100_000
    kept = sorted(p.read_bytes() for p in cache.iterdir() if not p.name.startswith("."))
    assert kept == sorted([blobs["/0.tar"], blobs["/2.tar"]])
    with pytest.raises(ValueError, match=r"cache_limit is 150000 bytes .* but the 2 files hold 200000 bytes .*: a packed dataset is staged whole"):
        remote.stage(urls[2:], FAST, cache, cache_limit="150kB")


def poll(condition, what):
    deadline = time.monotonic() + 120
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)  # polls state another process changes: bounded by the deadline


def test_processes_sharing_a_cache_fetch_each_shard_once(faulty, tmp_path, rng):
    blobs = {f"/{k}.tar": rng.bytes(150_000) for k in range(3)}
    urls = [faulty.put(p, d, faults=["stall"]) for p, d in blobs.items()]  # each shard's first GET stalls
    cache = tmp_path / "cache"
    script = ("import sys, json; from fastpipe.data import remote; "
              "print(json.dumps(remote.stage(sys.argv[2:], dict(retry_backoff=1.0), sys.argv[1])[1]))")

    def start():
        return subprocess.Popen([sys.executable, "-c", script, str(cache)] + urls, stdout=subprocess.PIPE, text=True)

    def requests(method):
        return sum(m == method for m, _, _ in list(faulty.log))

    first = start()
    poll(lambda: requests("GET") == 3, "the first process's GETs")  # it holds the three shards' locks
    second = start()
    poll(lambda: requests("HEAD") == 6, "the second process's HEADs")  # its lock attempts follow at once
    faulty.release.set()  # the stalled GETs end cut short; their retries wait 0.5-1 s (retry_backoff)
    a, b = (json.loads(p.communicate(timeout=120)[0]) for p in (first, second))
    assert first.returncode == 0 and second.returncode == 0
    assert (a["shards_fetched"], b["shards_fetched"], b["shards_waited"], b["cache_hits"]) == (3, 0, 3, 3)
    for path, data in blobs.items():
        assert len(faulty.gets(path)) == 2  # the stalled GET and its retry: one process fetched it
    staged, _ = remote.stage(urls, FAST, cache)
    assert [open(p, "rb").read() for p in staged] == list(blobs.values())


def test_a_killed_download_leaves_nothing_that_is_read(faulty, tmp_path, rng):
    data = rng.bytes(300_000)
    url = faulty.put("/killed.tar", data, faults=["ok", "stall"])
    cache = tmp_path / "cache"
    script = "import sys; from fastpipe.data import remote; remote.stage([sys.argv[2]], dict(part_size=65536, max_in_flight=1), sys.argv[1])"
    proc = subprocess.Popen([sys.executable, "-c", script, str(cache), url])
    poll(lambda: len(faulty.gets("/killed.tar")) == 2, "the stalled GET")
    proc.kill()
    proc.wait()
    faulty.release.set()
    leftovers = [n for n in os.listdir(cache) if ".part-" in n]
    assert leftovers  # killed mid-download: its temporary file is there, under a name never read
    path, stats = remote.stage([url], FAST, cache)
    assert open(path[0], "rb").read() == data and stats["shards_fetched"] == 1
    assert not [n for n in os.listdir(cache) if ".part-" in n]


def test_ctrl_c_ends_a_stalled_fetch(faulty, tmp_path, rng, ctrl_c):
    url = faulty.put("/stuck.tar", rng.bytes(100_000), faults=["stall"] * 5)
    sent = []

    def interrupt_when_stalled():
        poll(lambda: faulty.gets("/stuck.tar"), "the stalled GET")
        sent.append(time.monotonic())
        _thread.interrupt_main()

    threading.Thread(target=interrupt_when_stalled, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        remote.stage([url], dict(stall_timeout=60), tmp_path / "cache")  # a stall that would last 5 minutes
    assert time.monotonic() - sent[0] < 2  # polled every 100 ms
    assert not [n for n in os.listdir(tmp_path / "cache") if ".part-" in n]


def test_a_full_cache_disk_is_a_clear_error(faulty, tmp_path, rng):
    """The cache on a 320 KiB tmpfs (mounted in a private mount namespace, where the machine allows it):
    a shard that fits is fetched, the next one that does not is refused before any transfer, naming the
    cache and the bytes."""
    if not shutil.which("unshare") or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("no private mount namespace here (unshare -m needs root)")
    urls = [faulty.put(f"/{k}.tar", rng.bytes(200_000)) for k in range(2)]
    cache = tmp_path / "small"
    cache.mkdir()
    script = ("import sys; from fastpipe.data import remote\n"
              "remote.stage([sys.argv[2]], {}, sys.argv[1])\n"
              "try:\n    remote.stage([sys.argv[3]], {}, sys.argv[1])\n"
              "except OSError as e:\n    print('refused:', e)\n")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o size=320k tmpfs "$0" && exec "$@"',
                           str(cache), sys.executable, "-c", script, str(cache), *urls],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert re.search(rf"refused: \[Errno 28\] cache_dir '{re.escape(str(cache))}' has \d+ bytes .* free but the shards to "
                     rf"fetch need 200000 bytes", proc.stdout), proc.stdout
    assert len(faulty.gets("/0.tar")) >= 1 and faulty.gets("/1.tar") == []


def test_packed_formats_from_s3_and_http(s3, tmp_path, rng):
    """write_images' folder, .npy columns and a token file, uploaded as they are: the same batches as the
    local copies."""
    items = [(jpeg_bytes(picture(rng, int(rng.integers(20, 60)), int(rng.integers(20, 60)))), int(rng.integers(0, 4)))
             for _ in range(23)]
    packed = fastpipe.write_images(items, str(tmp_path / "packed"), progress=False)
    x = rng.integers(0, 256, (37, 5, 3), dtype=np.uint8)
    y = rng.standard_normal(37).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    rng.integers(0, 50_000, 4099, dtype=np.uint16).tofile(tmp_path / "tokens.bin")
    for name in os.listdir(tmp_path / "packed"):
        s3.put("data", f"packed/{name}", (tmp_path / "packed" / name).read_bytes())
    for name in ("x.npy", "y.npy", "tokens.bin"):
        s3.put("data", f"cols/{name}", (tmp_path / name).read_bytes())
    opts = dict(storage_options=s3.options(), cache_dir=tmp_path / "cache")
    images = fastpipe.ImageDataset("s3://data/packed", **opts)
    assert images.fetch_stats["shards_fetched"] == 6 and "s3://data/packed" in repr(images)
    assert images.classes == packed.classes and len(images) == len(packed)
    for (a, la), (b, lb) in zip(batches(images, shuffle=True, seed=2), batches(packed, shuffle=True, seed=2), strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)
    again = fastpipe.ImageDataset("s3://data/packed", **opts)
    assert again.path == images.path and again.fetch_stats["cache_hits"] == 6

    def all_batches(ds):
        ld = fastpipe.Loader(ds, batch_size=8, shuffle=True, seed=4)
        return [{k: v.numpy().copy() for k, v in b.items()} if isinstance(b, dict) else b.numpy().copy() for b in ld]

    columns = fastpipe.NpyDataset({"x": "s3://data/cols/x.npy", "y": "s3://data/cols/y.npy"}, **opts)
    local = fastpipe.NpyDataset({"x": str(tmp_path / "x.npy"), "y": str(tmp_path / "y.npy")})
    for a, b in zip(all_batches(columns), all_batches(local), strict=True):
        np.testing.assert_array_equal(a["x"], b["x"])
        np.testing.assert_array_equal(a["y"], b["y"])
    with nginx(tmp_path, tmp_path / "nginx") as server:
        tokens = fastpipe.TokenDataset(server.url + "/tokens.bin", 64, storage_options={}, cache_dir=tmp_path / "c2")
    ld_a, ld_b = (fastpipe.Loader(d, batch_size=8, shuffle=True, seed=1) for d in
                  (tokens, fastpipe.TokenDataset(str(tmp_path / "tokens.bin"), 64)))
    for a, b in zip(ld_a, ld_b, strict=True):
        for u, v in zip(a, b, strict=True):
            np.testing.assert_array_equal(u.numpy(), v.numpy())
    with pytest.raises(ValueError, match="NpyDataset: remote URLs and local paths cannot be mixed"):
        fastpipe.NpyDataset(["s3://data/cols/x.npy", str(tmp_path / "y.npy")], **opts)
    with pytest.raises(ValueError, match="ImageDataset: storage_options, cache_dir and cache_limit apply"):
        fastpipe.ImageDataset(str(tmp_path / "packed"), cache_dir=tmp_path)
    with pytest.raises(OSError, match=r"'s3://data/nothing/[a-z]+\.[a-z]+': HTTP 404, not found"):
        fastpipe.ImageDataset("s3://data/nothing", **opts)
