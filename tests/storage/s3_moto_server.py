"""moto_server for shardpoint's S3 tests, with SigV4 checking on and one moto bug fixed.

moto 5.2.1 verifies signatures against the *decoded* request URL (werkzeug's request.url),
so a key with '=' or '+' or a list prefix with '/' fails even for boto3: the client signs
the AWS-canonical encoding (prefix=a%2F), moto recomputes over prefix=a/. This launcher
makes moto's signature check use the raw request target exactly as sent (RAW_URI), which is
what AWS does. Signatures are still verified; only the bytes moto hashes change.

Usage: python3 s3_moto_server.py PORT   (binds 127.0.0.1; set INITIAL_NO_AUTH_ACTION_COUNT)
"""
import sys
from urllib.parse import urlsplit, urlunsplit

from moto.core import authorization, responses


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


responses.BaseResponse.setup_class = _setup_class
authorization.ActionAuthenticatorMixin._authenticate_and_authorize_action = _auth

if __name__ == "__main__":
    from moto.server import main
    main(["-H", "127.0.0.1", "-p", sys.argv[1]])
