"""moto_server for shardpoint's S3 tests, with SigV4 checking on, one moto bug fixed and
S3's body checks added.

moto 5.2.1 verifies signatures against the *decoded* request URL (werkzeug's request.url),
so a key with '=' or '+' or a list prefix with '/' fails even for boto3: the client signs
the AWS-canonical encoding (prefix=a%2F), moto recomputes over prefix=a/. This launcher
makes moto's signature check use the raw request target exactly as sent (RAW_URI), which is
what AWS does. Signatures are still verified; only the bytes moto hashes change.

moto 5.2.1 checks no request body against its checksums: its SigV4 check takes the
x-amz-content-sha256 header as given, Content-MD5 is ignored and x-amz-checksum-crc32c is
stored as given, so a body damaged on the way is stored. S3 refuses such a body, as
documented for each header; this launcher does the same before moto sees the request:
  Content-MD5 not base64 of 16 bytes              400 InvalidDigest
  Content-MD5 not the MD5 of the body             400 BadDigest
  x-amz-content-sha256 (a hex digest, not UNSIGNED-PAYLOAD or STREAMING-...) not the
  SHA-256 of the body                             400 XAmzContentSHA256Mismatch
  x-amz-checksum-crc32c not base64 of 4 bytes     400 InvalidRequest
  x-amz-checksum-crc32c not the CRC-32C of the    400 BadDigest
  body (base64, big-endian)

The gs:// driver's XML requests (sent to this server in tests) ask for a create-only write
with GCS's "x-goog-if-generation-match: 0"; moto knows only S3's "If-None-Match: *", so the
launcher passes the first on as the second (the same condition: no object under the key).

Usage: python3 s3_moto_server.py PORT   (binds 127.0.0.1; set INITIAL_NO_AUTH_ACTION_COUNT)
"""
import base64
import binascii
import hashlib
import io
import os
import re
import sys
from urllib.parse import urlsplit, urlunsplit

from moto.core import authorization, responses
from moto.moto_server import werkzeug_app

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gcs_json_server import crc32c  # noqa: E402  (the tests' one CRC-32C: ISA-L or a table)


_orig_setup = responses.BaseResponse.setup_class


def _setup_class(self, request, full_url, headers, use_raw_body=False):
    _orig_setup(self, request, full_url, headers, use_raw_body)
    raw = getattr(request, "environ", {}).get("RAW_URI") if hasattr(request, "environ") else None
    self._sp_raw_uri = raw


_orig_auth = authorization.ActionAuthenticatorMixin._authenticate_and_authorize_action


def _auth(self, iam_request_cls, resource="*"):
    raw = getattr(self, "_sp_raw_uri", None)
    if not raw:
        return _orig_auth(self, iam_request_cls, resource)
    decoded = self.uri
    parts = urlsplit(decoded)
    path, _, query = raw.partition("?")
    self.uri = urlunsplit((parts.scheme, parts.netloc, path, query, ""))
    try:
        return _orig_auth(self, iam_request_cls, resource)
    finally:
        self.uri = decoded


def _s3_error(start_response, code, message):
    body = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>%s</Code><Message>%s</Message>'
            '<RequestId>SPMOTOBODYCHECK</RequestId></Error>' % (code, message)).encode()
    start_response("400 Bad Request", [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
    return [body]


def _body_problem(environ, body):
    """S3's error code and message for a body that does not match its checksum headers, or None."""
    md5 = environ.get("HTTP_CONTENT_MD5")
    if md5 is not None:
        try:
            digest = base64.b64decode(md5, validate=True)
        except (binascii.Error, ValueError):
            digest = b""
        if len(digest) != 16:
            return "InvalidDigest", "The Content-MD5 you specified is not valid."
        if digest != hashlib.md5(body).digest():
            return "BadDigest", "The Content-MD5 you specified did not match what we received."
    sha256 = environ.get("HTTP_X_AMZ_CONTENT_SHA256", "")
    if re.fullmatch(r"[0-9a-f]{64}", sha256) and sha256 != hashlib.sha256(body).hexdigest():
        return "XAmzContentSHA256Mismatch", "The provided 'x-amz-content-sha256' header does not match what was computed."
    # After the signed SHA-256 (S3 does not document which of the two it checks first; a body
    # damaged on the way fails both).
    crc = environ.get("HTTP_X_AMZ_CHECKSUM_CRC32C")
    if crc is not None:
        try:
            given = base64.b64decode(crc, validate=True)
        except (binascii.Error, ValueError):
            given = b""
        if len(given) != 4:
            return "InvalidRequest", "Value for x-amz-checksum-crc32c header is invalid."
        if given != crc32c(body).to_bytes(4, "big"):
            return "BadDigest", "The CRC32C you specified did not match the calculated checksum."
    return None


_orig_call = werkzeug_app.DomainDispatcherApplication.__call__


def _checked_call(self, environ, start_response):
    if environ.get("HTTP_X_GOOG_IF_GENERATION_MATCH") == "0":
        environ["HTTP_IF_NONE_MATCH"] = "*"
    length = environ.get("CONTENT_LENGTH")
    if length and length.isdigit() and int(length) > 0:
        body = environ["wsgi.input"].read(int(length))
        environ["wsgi.input"] = io.BytesIO(body)
        problem = _body_problem(environ, body)
        if problem:
            return _s3_error(start_response, *problem)
    return _orig_call(self, environ, start_response)


responses.BaseResponse.setup_class = _setup_class
authorization.ActionAuthenticatorMixin._authenticate_and_authorize_action = _auth
werkzeug_app.DomainDispatcherApplication.__call__ = _checked_call

if __name__ == "__main__":
    from moto.server import main
    main(["-H", "127.0.0.1", "-p", sys.argv[1]])
