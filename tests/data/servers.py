"""Servers the remote-shard tests start on 127.0.0.1 and stop themselves: moto's S3 API server (a
subprocess, with IAM authentication on, so that it checks every request's SigV4 signature), nginx serving
a folder (ranges, ETags), and a scripted HTTP server that injects faults request by request."""

import hashlib
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, proc, what, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} before listening")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)  # a bounded wait for another process to bind, not a synchronisation of ours
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout} s")


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class MotoS3:
    """moto's server with authentication on: one IAM user allowed s3:*, whose keys sign the requests."""

    def __init__(self):
        boto3 = pytest.importorskip("boto3", reason="moto[server] (requirements/common.txt) brings boto3")
        pytest.importorskip("moto.server", reason="moto[server] is in requirements/common.txt")
        self.port = free_port()
        # The first three requests (the user, its policy, its key) are let through; every later one must be
        # signed by a known key.
        env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="3", AWS_ACCESS_KEY_ID="bootstrap",
                   AWS_SECRET_ACCESS_KEY="bootstrap")
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_port(self.port, self.proc, "moto's S3 server")
            self.endpoint = f"http://127.0.0.1:{self.port}"
            iam = boto3.client("iam", endpoint_url=self.endpoint, region_name="us-east-1",
                               aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
            iam.create_user(UserName="reader")
            iam.put_user_policy(UserName="reader", PolicyName="s3", PolicyDocument=json.dumps(
                {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
            key = iam.create_access_key(UserName="reader")["AccessKey"]
            self.key, self.secret = key["AccessKeyId"], key["SecretAccessKey"]
            self.client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                                       aws_access_key_id=self.key, aws_secret_access_key=self.secret)
        except BaseException:
            stop(self.proc)
            raise

    def options(self, **more):
        return dict(endpoint_url=self.endpoint, key=self.key, secret=self.secret, **more)

    def put(self, bucket, key, data):
        try:
            self.client.create_bucket(Bucket=bucket)
        except self.client.exceptions.BucketAlreadyOwnedByYou:
            pass
        self.client.put_object(Bucket=bucket, Key=key, Body=data)
        return f"s3://{bucket}/{key}"

    def close(self):
        stop(self.proc)


class Nginx:
    """nginx serving `root` on 127.0.0.1 (ranges and ETags as for any static file)."""

    def __init__(self, root, workdir):
        binary = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
        if binary is None:
            pytest.skip("nginx is not installed (`make system-deps` installs it)")
        self.port = free_port()
        os.makedirs(workdir, exist_ok=True)
        conf = os.path.join(workdir, "nginx.conf")
        temps = " ".join(f"{k}_temp_path {os.path.join(workdir, k)};" for k in
                         ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        with open(conf, "w") as f:
            f.write(f"daemon off; master_process off; worker_processes 1; pid {workdir}/nginx.pid;\n"
                    f"error_log {workdir}/error.log;\nevents {{ worker_connections 256; }}\n"
                    f"http {{ access_log off; {temps}\n"
                    f"  server {{ listen 127.0.0.1:{self.port}; root {root}; }} }}\n")
        self.proc = subprocess.Popen([binary, "-p", workdir, "-c", conf, "-e", os.path.join(workdir, "error.log")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_for_port(self.port, self.proc, "nginx")
        except BaseException:
            stop(self.proc)
            raise
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self):
        stop(self.proc)


class FaultyServer:
    """HTTP/1.1 with ranges, ETags and If-Match over in-memory objects, and a script of faults: each GET
    takes the next fault of its path's list ("503", "truncate" (half the body, then the connection
    closes), "reset" (closed before any answer), "stall" (the headers, then silence until released),
    "ignore_range" (200 and the whole object), "replace:<hex>" (the object changes before the answer),
    or "ok"). Every request is logged: (method, path, Range header)."""

    def __init__(self):
        self.objects, self.faults, self.log = {}, {}, []
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
                    extra = [("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")]
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

    def gets(self, path):
        with self.lock:
            return [r for m, p, r in self.log if m == "GET" and p == path]

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def etag_of(data):
    return '"' + hashlib.md5(data).hexdigest() + '"'
