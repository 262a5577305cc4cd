"""Servers the remote-shard tests start on 127.0.0.1 and stop themselves: moto's S3 server and nginx
(fastpipe/bench/servers.py, which the benchmark uses too; skipped where not installed), and a scripted
HTTP server that injects faults request by request."""

import hashlib
import http.server
import socket
import threading

import pytest

from fastpipe.bench import servers


# storage_options for the tests' servers: many ranged GETs a shard, retries without long waits.
FAST = dict(retry_backoff=0.01, part_size=64 << 10)


def moto_s3():
    try:
        return servers.MotoS3()
    except servers.ServerUnavailable as e:
        pytest.skip(str(e))


def nginx(root, workdir):
    try:
        return servers.Nginx(root, workdir)
    except servers.ServerUnavailable as e:
        pytest.skip(str(e))


class FaultyServer:
    """HTTP/1.1 with ranges, ETags and If-Match over in-memory objects, and a script of faults: each GET
    takes the next fault of its path's list ("503", "truncate" (half the body, then the connection
    closes), "reset" (closed before any answer), "stall" (the headers, then silence until released),
    "ignore_range" (200 and the whole object), "no_content_range" (206 without saying which bytes),
    "replace:<hex>" (the object changes before the answer),
    or "ok"); and `hold(path, first byte)`, when set, holds the ranged GETs it is true for until released.
    A PUT stores its body where `writable` (after the faults of `put_faults`, in order: "503"), else is
    answered 405, as nginx answers it. Every request is logged: (method, path, Range header)."""

    def __init__(self):
        self.objects, self.faults, self.log = {}, {}, []
        self.ranges = True  # False: HEADs do not say Accept-Ranges
        self.writable = False
        self.put_faults = []
        self.hold = None
        self.release = threading.Event()
        self.lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle(self):
                try:
                    super().handle()
                except ConnectionError:  # the client gave up on a faulty answer
                    pass

            def _object(self):
                with server.lock:
                    server.log.append((self.command, self.path, self.headers.get("Range")))
                    data = server.objects.get(self.path)
                    fault = server.faults.get(self.path, []).pop(0) if self.command == "GET" and server.faults.get(self.path) else "ok"
                    if fault.startswith("replace:"):
                        data = server.objects[self.path] = bytes.fromhex(fault.split(":", 1)[1])
                return data, fault

            def _headers(self, status, length, etag, extra=()):
                self.send_response(status)
                self.send_header("Content-Length", str(length))
                self.send_header("ETag", etag)
                if server.ranges:
                    self.send_header("Accept-Ranges", "bytes")
                for k, v in extra:
                    self.send_header(k, v)
                self.end_headers()

            def do_HEAD(self):
                data, _ = self._object()
                if data is None:
                    self.send_error(404)
                    return
                self._headers(200, len(data), etag_of(data))

            def _empty(self, status):
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_PUT(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with server.lock:
                    server.log.append(("PUT", self.path, None))
                    fault = server.put_faults.pop(0) if server.put_faults else "ok"
                if not server.writable or fault == "503":
                    self._empty(405 if not server.writable else 503)
                    return
                with server.lock:
                    server.objects[self.path] = body
                self._empty(200)

            def do_GET(self):
                data, fault = self._object()
                if data is None:
                    self.send_error(404)
                    return
                etag = etag_of(data)
                if fault == "reset":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fault == "503":
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.headers.get("If-Match") not in (None, etag):
                    self.send_response(412)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                start, end, status, extra = 0, len(data), 200, []
                rng = self.headers.get("Range")
                if rng and fault != "ignore_range":
                    a, b = rng.split("=", 1)[1].split("-")
                    start, end, status = int(a), min(int(b) + 1, len(data)), 206
                    extra = [] if fault == "no_content_range" else [("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")]
                    if server.hold is not None and server.hold(self.path, start):
                        server.release.wait(60)
                self._headers(status, end - start, etag, extra)
                body = data[start:end]
                if fault == "truncate":
                    self.wfile.write(body[:len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fault == "stall":
                    self.wfile.write(body[:1])
                    self.wfile.flush()
                    server.release.wait(60)
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def put(self, path, data, faults=()):
        with self.lock:
            self.objects[path] = data
            self.faults[path] = list(faults)
        return self.url + path

    def gets(self, path, method="GET"):
        with self.lock:
            return [r for m, p, r in self.log if m == method and p == path]

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def etag_of(data):
    return '"' + hashlib.md5(data).hexdigest() + '"'
