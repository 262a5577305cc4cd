"""Shards at s3:// and http(s):// URLs, staged into a local cache, or streamed through it, and read there.

The transfers run in C++ without the GIL (csrc/core/http_fetch.cpp: libcurl, ranged GETs in flight
together, retries with backoff, SigV4 for S3); this module turns URLs and ``storage_options`` into the
requests to make and resolves AWS credentials as botocore does (without its instance-metadata, SSO and
web-identity providers).
"""

import configparser
import hashlib
import os
import re
import shutil
import tempfile
import urllib.parse

from fastpipe import _checks as checks
from fastpipe._cache_home import cache_home
from fastpipe._ext import _C

REMOTE = re.compile(r"^(s3|https?)://", re.IGNORECASE)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")

# storage_options: fsspec's (s3fs's) names, and the transport's settings with their defaults.
_TRANSPORT = {"max_in_flight": 16, "part_size": 8 << 20, "max_attempts": 8, "retry_backoff": 0.2,
              "connect_timeout": 10.0, "stall_timeout": 30.0}
_OPTIONS = {"anon", "key", "secret", "token", "endpoint_url", "region", "profile", "addressing_style",
            "client_kwargs"} | set(_TRANSPORT)


def is_remote(url):
    """True for a URL with a scheme (s3, http, https and the ones not supported, which ``stage`` refuses)."""
    return bool(_SCHEME.match(url))


def default_cache_dir():
    """``$FASTPIPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/fastpipe/shards`` (``~/.cache/fastpipe/shards``)."""
    if os.environ.get("FASTPIPE_CACHE_DIR"):
        return os.environ["FASTPIPE_CACHE_DIR"]
    return cache_home("shards")


class _Profile:
    """The AWS shared files' settings for one profile (credentials file first, then config file)."""

    def __init__(self, name, explicit):
        self.name, self.values = name, {}
        creds = os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.expanduser("~/.aws/credentials")
        config = os.environ.get("AWS_CONFIG_FILE") or os.path.expanduser("~/.aws/config")
        found = False
        for path, section in ((config, name if name == "default" else f"profile {name}"), (creds, name)):
            parser = configparser.RawConfigParser()
            try:
                parser.read(path)
            except configparser.Error as e:
                raise ValueError(f"storage_options: cannot parse the AWS file '{path}': {e}") from None
            if parser.has_section(section):
                found = True
                self.values.update((k.lower(), v.strip()) for k, v in parser.items(section))
        if explicit and not found:
            raise ValueError(f"storage_options: the AWS profile '{name}' is in neither '{creds}' nor '{config}'")

    def get(self, key):
        return self.values.get(key) or None


class S3Settings:
    """Endpoint, region, addressing and credentials for s3:// URLs, from ``storage_options`` first, then the
    environment (AWS_*), then the profile's shared files, as botocore looks them up."""

    def __init__(self, options):
        client = options.get("client_kwargs") or {}
        profile_name = options.get("profile") or os.environ.get("AWS_PROFILE") or "default"
        profile = _Profile(profile_name, explicit=bool(options.get("profile") or os.environ.get("AWS_PROFILE")))
        self.region = (options.get("region") or client.get("region_name") or os.environ.get("AWS_REGION")
                       or os.environ.get("AWS_DEFAULT_REGION") or profile.get("region") or "us-east-1")
        self.endpoint = (options.get("endpoint_url") or client.get("endpoint_url")
                         or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
                         or profile.get("endpoint_url"))
        style = options.get("addressing_style", "auto")
        if style not in ("auto", "path", "virtual"):
            raise ValueError(f"storage_options addressing_style must be 'auto', 'path' or 'virtual', got {style!r}")
        # auto: virtual-hosted buckets on AWS's own endpoints, path style on any other (MinIO, Ceph, moto).
        self.path_style = style == "path" or (style == "auto" and self.endpoint is not None)
        if self.endpoint is None:
            self.endpoint = f"https://s3.{self.region}.amazonaws.com"
        parts = urllib.parse.urlsplit(self.endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"storage_options endpoint_url must be an http(s) URL, got {self.endpoint!r}")
        self.anon = bool(options.get("anon", False))
        self.credentials = ("", "", "")
        if self.anon:
            return
        if options.get("key") or options.get("secret"):
            if not (options.get("key") and options.get("secret")):
                raise ValueError("storage_options: 'key' and 'secret' go together (the access key id and the secret key)")
            self.credentials = (options["key"], options["secret"], options.get("token") or "")
        elif os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"):
            self.credentials = (os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"],
                                os.environ.get("AWS_SESSION_TOKEN") or os.environ.get("AWS_SECURITY_TOKEN") or "")
        elif profile.get("aws_access_key_id") and profile.get("aws_secret_access_key"):
            self.credentials = (profile.get("aws_access_key_id"), profile.get("aws_secret_access_key"),
                                profile.get("aws_session_token") or "")
        else:
            raise ValueError(f"no AWS credentials for s3:// URLs: set storage_options key and secret, the "
                             f"AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY variables or a profile (AWS_PROFILE, "
                             f"'{profile_name}' now) in ~/.aws/credentials; or storage_options anon=True for a "
                             f"public bucket")

    def request(self, url):
        """(name, request URL, Host header, encoded path) of ``s3://bucket/key``."""
        parts = urllib.parse.urlsplit(url)
        bucket, key = parts.netloc, parts.path.lstrip("/")
        if not bucket or not key:
            raise ValueError(f"'{url}' is not an object URL (s3://bucket/key)")
        end = urllib.parse.urlsplit(self.endpoint)
        key = urllib.parse.quote(key, safe="/~")
        dns_bucket = re.fullmatch(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]", bucket) is not None
        if self.path_style or not dns_bucket:
            host, path = _host(end), f"{end.path.rstrip('/')}/{bucket}/{key}"
        else:
            host, path = f"{bucket}.{_host(end)}", f"{end.path.rstrip('/')}/{key}"
        return url, f"{end.scheme}://{host}{path}", host, path


def _host(parts):
    """host[:port] as curl sends it in the Host header (the scheme's default port left out)."""
    default = {"http": 80, "https": 443}[parts.scheme]
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return host if parts.port in (None, default) else f"{host}:{parts.port}"


def _http_request(url):
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname or not parts.path or parts.path.endswith("/"):
        raise ValueError(f"'{url}' is not the URL of a file")
    return url, url, _host(parts), parts.path


def _requests(urls, storage_options, cache_dir, cache_limit):
    """The checked arguments of a transfer: (objects, cache_dir, limit, auth, transport)."""
    options = dict(storage_options or {})
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise TypeError(f"storage_options: unknown setting {unknown[0]!r} (known: {', '.join(sorted(_OPTIONS))})")
    bad = [u for u in urls if not REMOTE.match(u)]
    if bad:
        raise ValueError(f"'{bad[0]}': only s3://, http:// and https:// URLs are read (and local paths)")
    if not _C.HTTP_AVAILABLE:
        raise RuntimeError(f"'{urls[0]}': this fastpipe was built without libcurl, so it cannot read s3:// or "
                           f"http(s):// URLs: install its headers (Debian/Ubuntu: apt-get install "
                           f"libcurl4-openssl-dev; `make setup` does it) and reinstall fastpipe")
    transport = {k: options.get(k, v) for k, v in _TRANSPORT.items()}
    transport["max_in_flight"] = checks.integer(transport["max_in_flight"], "storage_options max_in_flight", low=1,
                                                high=1024)
    transport["part_size"] = checks.byte_size(transport["part_size"], "storage_options part_size")
    if transport["part_size"] < 64 << 10:
        raise ValueError(f"storage_options part_size must be at least 64 KiB, got {transport['part_size']}")
    transport["max_attempts"] = checks.integer(transport["max_attempts"], "storage_options max_attempts", low=1)
    transport["retry_backoff"] = checks.real(transport["retry_backoff"], "storage_options retry_backoff", low=0.0)
    for k in ("connect_timeout", "stall_timeout"):
        transport[k] = checks.real(transport[k], f"storage_options {k}", positive=True)
    cache_dir = os.path.abspath(os.path.expanduser(os.fspath(cache_dir))) if cache_dir is not None else default_cache_dir()
    limit = -1 if cache_limit is None else checks.byte_size(cache_limit, "cache_limit")
    s3 = [u.lower().startswith("s3://") for u in urls]
    if any(s3) and not all(s3):
        raise ValueError("urls: s3:// and http(s):// URLs cannot be mixed in one dataset (their requests are "
                         "signed differently); stage them as two datasets")
    settings = S3Settings(options) if s3[0] else None
    objects = [settings.request(u) if settings else _http_request(u) for u in urls]
    sign = settings is not None and not settings.anon
    auth = (sign, settings.region if settings else "") + (settings.credentials if sign else ("", "", ""))
    return objects, cache_dir, limit, auth, transport


def stage(urls, storage_options=None, cache_dir=None, cache_limit=None):
    """Fetches the objects at ``urls`` (s3:// or http(s)://) into ``cache_dir`` unless they are there
    already, in the same version (ETag and size); returns their local paths and the transfer's counters."""
    objects, cache_dir, limit, auth, transport = _requests(urls, storage_options, cache_dir, cache_limit)
    got = _C.stage_shards(objects, cache_dir, limit, auth, transport)
    paths = got.pop("paths")
    got["cache_dir"] = cache_dir
    return paths, got


def stream(urls, storage_options=None, cache_dir=None, cache_limit=None):
    """A ``_C.ShardStream`` of the objects at ``urls``: HEADs now; each shard fetched into the cache when a
    pass's plan or a reader asks for it, the cache kept under ``cache_limit``."""
    objects, cache_dir, limit, auth, transport = _requests(urls, storage_options, cache_dir, cache_limit)
    return _C.ShardStream(objects, cache_dir, limit, auth, transport)


def put(url, data, storage_options=None):
    """Uploads ``data`` (bytes) to ``url`` (s3:// or http(s)://) with one PUT, retried as fetches are;
    PermissionError for 401 and 403, OSError for any other failure, naming the URL."""
    objects, _, _, auth, transport = _requests([url], storage_options, None, None)
    _C.put_object(objects[0], data, auth, transport)


def all_remote(paths, storage_options, cache_dir, cache_limit, what):
    """True when every path is a remote URL, False when none is (then the remote settings must be unset);
    a mix is an error."""
    remote = [is_remote(p) for p in paths]
    if not any(remote):
        if storage_options is not None or cache_dir is not None or cache_limit is not None:
            raise ValueError(f"{what}: storage_options, cache_dir and cache_limit apply to remote URLs (s3://, "
                             f"http(s)://); these are local paths")
        return False
    if not all(remote):
        raise ValueError(f"{what}: remote URLs and local paths cannot be mixed in one dataset")
    return True


def local_paths(paths, storage_options, cache_dir, cache_limit, what):
    """`paths` as local files: remote URLs staged into the cache (all of them remote, or none), local paths
    made absolute. Returns (paths, the staging's counters or None)."""
    if all_remote(paths, storage_options, cache_dir, cache_limit, what):
        return stage(paths, storage_options, cache_dir, cache_limit)
    return [os.path.abspath(p) for p in paths], None


def local_folder(url, names, storage_options, cache_dir, cache_limit):
    """The files `names` of the folder at `url` staged, and a local folder holding them under those names
    (relative links into the cache, made under a temporary name and renamed: a folder per version of the
    files). Returns (folder, counters)."""
    paths, stats = stage([url.rstrip("/") + "/" + n for n in names], storage_options, cache_dir, cache_limit)
    cached = os.path.dirname(paths[0])
    versions = "\n".join([url] + [os.path.basename(p) for p in paths])
    folders = os.path.join(cached, "folders")
    folder = os.path.join(folders, hashlib.sha256(versions.encode()).hexdigest()[:16])
    if not os.path.isdir(folder):
        os.makedirs(folders, exist_ok=True)
        temp = tempfile.mkdtemp(dir=folders, prefix=".")
        for name, path in zip(names, paths):
            os.symlink(os.path.relpath(path, folder), os.path.join(temp, name))
        try:
            os.rename(temp, folder)
        except OSError:  # another process made it first
            shutil.rmtree(temp, ignore_errors=True)
    return folder, stats
