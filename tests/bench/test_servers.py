"""The delaying proxy the remote suite measures latency through (fastpipe/bench/servers.py DelayProxy): every
byte passes unchanged, each exchange takes a round trip more, and a connection the server ends ends."""

import os
import socket
import struct
import threading
import time

import pytest

from fastpipe.bench import servers


class _Server:
    """Answers each 8-byte request (offset, count) on a connection with bytes [offset, offset + count) of
    `data`; a count past the end sends what there is and closes the connection."""

    def __init__(self, data):
        self.data = data
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            while request := _exactly(conn, 8):
                offset, count = struct.unpack("<II", request)
                conn.sendall(self.data[offset:offset + count])
                if offset + count > len(self.data):
                    return

    def close(self):
        self.listener.close()


def _exactly(conn, n):
    out = b""
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return out


@pytest.fixture
def served():
    data = os.urandom(5_000_011)
    server = _Server(data)
    proxy = servers.DelayProxy(server.port, 150)
    try:
        yield data, proxy
    finally:
        proxy.close()
        server.close()


def _exchange(conn, offset, count):
    """(seconds to the first byte of the answer, the answer's bytes) for one request."""
    start = time.monotonic()
    conn.sendall(struct.pack("<II", offset, count))
    first = conn.recv(1 << 16)
    waited = time.monotonic() - start
    return waited, first + _exactly(conn, count - len(first))


def test_every_exchange_on_a_connection_takes_a_round_trip_more_and_its_bytes_pass_unchanged(served):
    data, proxy = served
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as conn:
        for offset, count in ((0, 1), (17, 3_000_017), (3_000_034, 1_999_977)):
            waited, got = _exchange(conn, offset, count)
            assert got == data[offset:offset + count]
            assert waited >= 0.15, f"the answer's first byte came {waited:.3f} s after the request"


def test_connections_are_served_at_once_and_independently(served):
    data, proxy = served
    conns = [socket.create_connection(("127.0.0.1", proxy.port), timeout=30) for _ in range(6)]
    try:
        spans = [(k * 700_001, 700_001 + k) for k in range(len(conns))]
        for conn, (offset, count) in zip(conns, spans):
            conn.sendall(struct.pack("<II", offset, count))
        for conn, (offset, count) in zip(conns, spans):
            assert _exactly(conn, count) == data[offset:offset + count]
    finally:
        for conn in conns:
            conn.close()


def test_a_connection_the_server_ends_ends_after_its_last_byte(served):
    data, proxy = served
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as conn:
        conn.sendall(struct.pack("<II", len(data) - 1000, 5000))  # past the end: 1000 bytes, then the end
        assert _exactly(conn, 5000) == data[-1000:]
        assert conn.recv(1) == b""


def test_a_client_that_ends_its_side_still_gets_the_answer(served):
    data, proxy = served
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as conn:
        conn.sendall(struct.pack("<II", 123, 2_000_003))
        conn.shutdown(socket.SHUT_WR)
        assert _exactly(conn, 2_000_003) == data[123:123 + 2_000_003]
        assert conn.recv(1) == b""  # the server saw the end, ended too, and the proxy passed that on
