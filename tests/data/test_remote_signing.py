"""The primitives that sign S3 requests (csrc/core/sha256.cpp, sigv4.cpp) against independent
implementations: hashlib and hmac, urllib's quoting, and botocore's own S3 SigV4 signer on the same
requests. (moto's server, which checks every signature, runs them end to end in test_remote_shards.py.)"""

import hashlib
import hmac
import urllib.parse

import pytest

from fastpipe._ext import _C


def test_sha256_and_hmac_are_hashlibs(rng):
    for n in list(range(0, 130)) + [int(rng.integers(130, 5000)) for _ in range(20)]:
        data = rng.bytes(n)
        assert _C._sha256(data) == hashlib.sha256(data).hexdigest(), n
        key = rng.bytes(int(rng.integers(0, 150)))  # keys longer than a block are hashed first
        assert _C._hmac_sha256(key, data) == hmac.new(key, data, hashlib.sha256).hexdigest(), (n, len(key))


def test_uri_encoding_is_sigv4s(rng):
    for _ in range(200):
        text = bytes(rng.integers(0, 256, int(rng.integers(0, 40)), dtype="uint8")).decode("latin-1")
        raw = text.encode("utf-8")
        for keep in (True, False):
            assert _C._uri_encode(raw, keep) == urllib.parse.quote(raw, safe="/~" if keep else "~")


@pytest.mark.parametrize("token", ["", "FQoGZXIvYXdzEJr//////////token+/="])
def test_signatures_are_botocores(rng, token):
    auth_mod = pytest.importorskip("botocore.auth")
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    for _ in range(20):
        key = "".join(rng.choice(list("abcXYZ019 +=_-~./%é"), int(rng.integers(1, 30))))
        path = "/" + urllib.parse.quote(f"bucket-{int(rng.integers(0, 99))}/{key}", safe="/~")
        region = str(rng.choice(["us-east-1", "eu-west-3", "ap-southeast-2"]))
        host = str(rng.choice(["127.0.0.1:9000", "s3.eu-west-3.amazonaws.com", "b.s3.amazonaws.com"]))
        begin = int(rng.integers(0, 1 << 40))
        headers = [("Range", f"bytes={begin}-{begin + int(rng.integers(0, 1 << 23))}")]
        if rng.random() < 0.5:
            headers.append(("If-Match", f'"{rng.bytes(16).hex()}-{int(rng.integers(1, 99))}"'))
        access, secret = "AKIA" + rng.bytes(8).hex().upper(), rng.bytes(20).hex()
        date = f"20{int(rng.integers(10, 40))}{int(rng.integers(1, 13)):02d}{int(rng.integers(1, 29)):02d}T" \
               f"{int(rng.integers(0, 24)):02d}{int(rng.integers(0, 60)):02d}{int(rng.integers(0, 60)):02d}Z"
        method = str(rng.choice(["GET", "HEAD", "PUT"]))
        body = rng.bytes(int(rng.integers(0, 5000))) if method == "PUT" else b""  # a PUT signs its body's hash
        ours = dict(_C._sigv4_sign(method, path, [("host", host)] + headers, region, access, secret, token, date,
                                   hashlib.sha256(body).hexdigest() if method == "PUT" else ""))
        request = AWSRequest(method=method, url=f"http://{host}{path}", headers=dict(headers), data=body)
        signer = auth_mod.S3SigV4Auth(Credentials(access, secret, token or None), "s3", region)
        request.context["timestamp"] = date
        signer._modify_request_before_signing(request)
        canonical = signer.canonical_request(request)
        signature = signer.signature(signer.string_to_sign(request, canonical), request)
        signer._inject_signature_to_request(request, signature)
        assert ours["Authorization"] == request.headers["Authorization"], canonical
        assert ours["x-amz-date"] == request.headers["X-Amz-Date"]
        assert ours["x-amz-content-sha256"] == request.headers["X-Amz-Content-SHA256"]
        assert ours.get("x-amz-security-token") == request.headers.get("X-Amz-Security-Token")
