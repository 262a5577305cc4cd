"""Servers on 127.0.0.1 for the remote-shard tests and benchmark, started and stopped by their user: moto's
S3 API server (a subprocess, with IAM authentication on, so that it checks every request's SigV4
signature), nginx serving a folder (ranges, ETags), and a TCP proxy that adds a round trip time to every
exchange (where the kernel has no netem).

``python fastpipe/bench/servers.py proxy LISTEN_PORT TARGET_PORT DELAY_MS`` runs the proxy in its own
process (what DelayProxy starts)."""

import fcntl
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time


class ServerUnavailable(RuntimeError):
    """A server's program or package is not installed (the tests skip, the benchmark says so)."""


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
            time.sleep(0.05)  # another process binding its port: polled, bounded by the deadline
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout} s")


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class _Process:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        stop(self.proc)

    def cpu_seconds(self):
        """CPU time of the server's process and its children (nginx's workers) so far: what it takes from
        the cores a benchmark shares with it."""
        ticks, todo = 0, [self.proc.pid]
        while todo:
            pid = todo.pop()
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                ticks += int(fields[11]) + int(fields[12])  # utime, stime
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            except (OSError, ValueError):
                pass  # exited meanwhile
        return ticks / os.sysconf("SC_CLK_TCK")


class MotoS3(_Process):
    """moto's server with authentication on: one IAM user allowed s3:*, whose keys sign the requests."""

    def __init__(self):
        try:
            import boto3
            import moto.server  # noqa: F401
        except ImportError as e:
            raise ServerUnavailable(f"moto[server] is not installed (requirements/common.txt): {e}") from None
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
        return {"endpoint_url": self.endpoint, "key": self.key, "secret": self.secret, **more}

    def put(self, bucket, key, data):
        try:
            self.client.create_bucket(Bucket=bucket)
        except self.client.exceptions.BucketAlreadyOwnedByYou:
            pass
        self.client.put_object(Bucket=bucket, Key=key, Body=data)
        return f"s3://{bucket}/{key}"

    def keys(self, bucket, prefix):
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


class NginxS3(_Process):
    """nginx answering S3's path-style GETs and HEADs (/bucket/key, ranges, ETags) from a folder, without
    checking signatures: S3 clients at the cost of a static file server, where moto's server would take
    much of a small machine's CPU. No LIST: clients are given the object keys. The same put/keys/options
    as MotoS3."""

    def __init__(self, workdir):
        self.root = os.path.join(workdir, "buckets")
        os.makedirs(self.root, exist_ok=True)
        self._nginx = Nginx(self.root, os.path.join(workdir, "nginx"))
        self.proc, self.port, self.endpoint = self._nginx.proc, self._nginx.port, self._nginx.url
        self.key, self.secret = "any-key", "any-secret"

    def options(self, **more):
        return {"endpoint_url": self.endpoint, "key": self.key, "secret": self.secret, **more}

    def put(self, bucket, key, data):
        path = os.path.join(self.root, bucket, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        return f"s3://{bucket}/{key}"

    def keys(self, bucket, prefix):
        top = os.path.join(self.root, bucket)
        found = (os.path.relpath(os.path.join(d, f), top) for d, _, fs in os.walk(top) for f in fs)
        return sorted(k for k in found if k.startswith(prefix))


class Nginx(_Process):
    """nginx serving `root` on 127.0.0.1 (ranges and ETags as for any static file)."""

    def __init__(self, root, workdir):
        binary = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
        if binary is None:
            raise ServerUnavailable("nginx is not installed (`make system-deps` installs it)")
        self.port = free_port()
        workdir = os.path.abspath(workdir)  # nginx takes relative paths from its prefix, not from here
        os.makedirs(workdir, exist_ok=True)
        conf = os.path.join(workdir, "nginx.conf")
        temps = " ".join(f"{k}_temp_path {os.path.join(workdir, k)};" for k in
                         ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        with open(conf, "w") as f:
            f.write(f"daemon off; master_process off; worker_processes 1; pid {workdir}/nginx.pid;\n"
                    f"error_log {workdir}/error.log;\nevents {{ worker_connections 256; }}\n"
                    f"http {{ access_log off; sendfile on; {temps}\n"
                    f"  server {{ listen 127.0.0.1:{self.port}; root {os.path.abspath(root)}; }} }}\n")
        self.proc = subprocess.Popen([binary, "-p", workdir, "-c", conf, "-e", os.path.join(workdir, "error.log")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_port(self.port, self.proc, "nginx")
        except BaseException:
            stop(self.proc)
            raise
        self.url = f"http://127.0.0.1:{self.port}"


class DelayProxy(_Process):
    """127.0.0.1:port forwarding to 127.0.0.1:target, a round trip of delay_ms more for every exchange, in
    its own process."""

    def __init__(self, target, delay_ms):
        self.port = free_port()
        # This file run as a script: the proxy's process imports neither fastpipe nor torch.
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "proxy", str(self.port), str(target),
                                      str(delay_ms)], stdout=subprocess.DEVNULL)
        wait_for_port(self.port, self.proc, "the delaying proxy")


# The proxy stands for a network's latency, not its cost, which it would take from the cores the loader
# decodes on: the whole round trip is added to the client's bytes (requests: small), so that the server's
# first byte reaches the client a round trip later than without the proxy, as over a real link, and the
# server's bytes (the data) pass through a pipe with splice(2), never copied into this process (4 MiB
# chunks through asyncio cost 0.34 CPU s per 344 MiB).
_PIPE = 1 << 20  # the default /proc/sys/fs/pipe-max-size


def _delayed(src, dst, delay):
    """Forwards src to dst, each chunk delay seconds after it arrived (in order)."""
    pending = queue.SimpleQueue()

    def send():
        while True:
            due, chunk = pending.get()
            time.sleep(max(0.0, due - time.monotonic()))  # the delay the proxy exists to add
            if not chunk:
                return
            dst.sendall(chunk)

    sender = threading.Thread(target=_guarded, args=(send, src, dst), daemon=True)
    sender.start()
    try:
        while chunk := src.recv(1 << 16):
            pending.put((time.monotonic() + delay, chunk))
    finally:
        pending.put((time.monotonic() + delay, b""))  # the end, in order (after a failed recv too)
        sender.join()
    dst.shutdown(socket.SHUT_WR)


def _spliced(src, dst):
    """Forwards src to dst through a pipe, the bytes never entering this process."""
    out, into = os.pipe()
    try:
        try:
            fcntl.fcntl(into, fcntl.F_SETPIPE_SZ, _PIPE)
        except PermissionError:
            pass  # pipe-max-size set lower and not root: the default 64 KiB, more calls for the same bytes
        while n := os.splice(src.fileno(), into, _PIPE):
            while n:
                n -= os.splice(out, dst.fileno(), n)
        dst.shutdown(socket.SHUT_WR)
    finally:
        os.close(out)
        os.close(into)


def _guarded(forward, *sockets):
    """Runs forward(); a connection that fails in one direction is ended in both, which wakes the other
    direction's blocked calls."""
    try:
        forward()
    except OSError:
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already shut or closed by the peer


def _connection(client, target, delay):
    with client:
        try:
            server = socket.create_connection(("127.0.0.1", target))
        except OSError:
            return
        with server:
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            up = threading.Thread(target=_guarded, args=(lambda: _delayed(client, server, delay), client, server),
                                  daemon=True)
            up.start()
            _guarded(lambda: _spliced(server, client), client, server)
            up.join()


def _proxy(port, target, delay_ms):
    with socket.create_server(("127.0.0.1", port), backlog=128) as listener:
        while True:
            client, _ = listener.accept()
            threading.Thread(target=_connection, args=(client, target, delay_ms / 1000.0), daemon=True).start()


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "proxy":
        sys.exit(__doc__)
    _proxy(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
