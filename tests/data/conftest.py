"""Fixtures of the remote-shard tests: the servers of tests/data/servers.py, started on 127.0.0.1 and
stopped by the tests themselves."""

import pytest

from servers import FaultyServer, moto_s3


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server (signatures checked), one per test module."""
    server = moto_s3()
    yield server
    server.close()


@pytest.fixture
def faulty():
    """The scripted HTTP server injecting faults request by request."""
    server = FaultyServer()
    yield server
    server.close()
