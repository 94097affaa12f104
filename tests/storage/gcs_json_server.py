#!/usr/bin/env python3
"""A small Google Cloud Storage JSON API server for the gs:// driver's tests (127.0.0.1 only).

The driver's functional tests run on fsouza's fake-gcs-server (tests/storage/fake_gcs_server.h);
this server stays for what that emulator cannot produce: injected faults (/_control/fault),
request and session counters (/_control/state), small list pages, a refused token, and 412
for ifGenerationMatch on downloads (fake-gcs-server v1.56.1 ignores it there). It is also
what the Python package's gs:// tests and the fault proxy tests use.

Implements exactly what src/storage/gcs/gcs_json_storage.cc uses, with the status codes and
headers of the real service:
  GET    /storage/v1/b/B/o?prefix=&pageToken=&maxResults=   list (pages of at most --page-size)
  GET    /storage/v1/b/B/o/NAME                             object resource (size, generation)
  DELETE /storage/v1/b/B/o/NAME                             204, 404
  GET    /download/storage/v1/b/B/o/NAME?alt=media          Range, ifGenerationMatch (412)
  POST   /upload/storage/v1/b/B/o?uploadType=media&name=N   whole object
  POST   /upload/storage/v1/b/B/o?uploadType=resumable&name=N   session URI in Location
         (both take ifGenerationMatch: 0 = only if no object exists; checked at the POST and,
         for a session, again atomically when its last chunk publishes: 412 conditionNotMet)
  PUT    <session URI> with Content-Range                   308 + Range until the last chunk
  DELETE <session URI>                                      499: session cancelled
Every request needs "Authorization: Bearer TOKEN" (401 otherwise). Non-final chunks must be
multiples of 256 KiB (400 otherwise), as GCS requires.

Checksums, as GCS documents them (cloud.google.com/storage/docs/data-validation): a media
upload, or the request that completes a resumable one, may carry "X-Goog-Hash:
crc32c=<base64 of the big-endian CRC-32C>,md5=<base64 of the MD5>" of the whole object. A
value that does not match the bytes received is refused with 400 and GCS's message
('Provided CRC32C "A" doesn't match calculated CRC32C "B".'), and no object is created.
GCS checks no chunk on its own, so a damaged earlier chunk shows only at the end. What GCS
does with a session after refusing its last request is not documented: this server keeps
the session as it was before that request, so the request can be sent again.

Test controls (no token): POST /_control/fault?mode=503|drop&count=N[&skip=K][&match=S] fails
the next N requests (after skipping K) whose "METHOD path" contains S: 503 with a JSON error,
or the connection closed without a response. GET /_control/state gives request, session and
object counts, the bytes open sessions hold and the body sizes of every chunk PUT so far, as
JSON.

Usage: gcs_json_server.py TOKEN BUCKET... [--page-size N]. Listens on a free port and prints
"PORT <n>" on stdout once it accepts connections.
"""
import argparse
import base64
import ctypes
import ctypes.util
import hashlib
import json
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

CHUNK_QUANTUM = 256 * 1024


def _isal_crc32c():
    """ISA-L's CRC-32C (shardpoint links ISA-L, so it is installed where the tests run), or None."""
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("isal") or "libisal.so.2").crc32_iscsi
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint32]
    fn.restype = ctypes.c_uint32
    return fn


_ISAL_CRC32C = _isal_crc32c()
_CRC32C_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC32C_TABLE.append(_c)


def crc32c(data):
    """The CRC-32C (Castagnoli) of data, as GCS computes it."""
    data = bytes(data)
    if _ISAL_CRC32C is not None:
        crc = 0xFFFFFFFF
        for at in range(0, len(data), 1 << 30):
            piece = data[at:at + (1 << 30)]
            crc = _ISAL_CRC32C(piece, len(piece), crc)
        return crc ^ 0xFFFFFFFF
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC32C_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def hash_mismatch(x_goog_hash, data):
    """GCS's message for an X-Goog-Hash value that data does not match, or None."""
    for part in (x_goog_hash or "").split(","):
        name, _, given = part.strip().partition("=")
        name = name.lower()
        if name == "crc32c":
            calculated = base64.b64encode(crc32c(data).to_bytes(4, "big")).decode()
            if given != calculated:
                return 'Provided CRC32C "%s" doesn\'t match calculated CRC32C "%s".' % (given, calculated)
        elif name == "md5":
            calculated = base64.b64encode(hashlib.md5(data).digest()).decode()
            if given != calculated:
                return 'Provided MD5 hash "%s" doesn\'t match calculated MD5 hash "%s".' % (given, calculated)
    return None


class State:
    def __init__(self, token, buckets, page_size):
        self.token = token
        self.page_size = page_size
        self.lock = threading.Lock()
        self.buckets = {b: {} for b in buckets}  # bucket -> name -> (bytes, generation)
        self.sessions = {}  # id -> {bucket, name, data: bytearray}
        self.generation = 1000
        self.requests = 0
        self.chunk_sizes = []  # body bytes of every session PUT, in arrival order
        self.fault = None  # {mode, count, skip, match}

    def take_fault(self, line):
        with self.lock:
            self.requests += 1
            f = self.fault
            if f is None or f["match"] not in line:
                return None
            if f["skip"] > 0:
                f["skip"] -= 1
                return None
            f["count"] -= 1
            if f["count"] <= 0:
                self.fault = None
            return f["mode"]

    def publish(self, bucket, name, data, if_generation_match=None):
        """Stores the object; None (nothing stored) when if_generation_match is not its generation (0: none)."""
        with self.lock:
            if if_generation_match is not None and self.generation_of(bucket, name) != int(if_generation_match):
                return None
            self.generation += 1
            self.buckets[bucket][name] = (bytes(data), self.generation)
            return self.resource(bucket, name)

    def generation_of(self, bucket, name):
        entry = self.buckets[bucket].get(name)
        return entry[1] if entry else 0

    def resource(self, bucket, name):
        data, gen = self.buckets[bucket][name]
        return {"kind": "storage#object", "bucket": bucket, "name": name, "size": str(len(data)),
                "generation": str(gen), "contentType": "application/octet-stream"}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gcs-json-test/1"

    def log_message(self, fmt, *args):
        pass

    # --- plumbing ---
    def body(self):
        n = int(self.headers.get("Content-Length", "0") or 0)
        return self.rfile.read(n) if n else b""

    def reply(self, status, payload=b"", headers=None, content_type="application/json"):
        if isinstance(payload, (dict, list)):
            payload = json.dumps(payload).encode()
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("X-GUploader-UploadID", "test-" + uuid.uuid4().hex[:8])
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def error(self, status, message):
        self.reply(status, {"error": {"code": status, "message": message, "errors": [{"message": message}]}})

    def precondition_failed(self):
        message = "At least one of the pre-conditions you specified did not hold."
        self.reply(412, {"error": {"code": 412, "message": message,
                                   "errors": [{"message": message, "reason": "conditionNotMet"}]}})

    def handle_any(self):
        st = self.server.state
        url = urlsplit(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        segments = url.path.split("/")
        if url.path.startswith("/_control/"):
            return self.control(url.path, q)
        data = self.body()
        mode = st.take_fault(self.command + " " + url.path + "?" + url.query)
        if mode == "drop":
            self.close_connection = True
            try:
                self.connection.shutdown(2)
            except OSError:
                pass
            return
        if mode == "503":
            return self.error(503, "injected fault: service unavailable")
        if self.headers.get("Authorization", "") != "Bearer " + st.token:
            return self.error(401, "Invalid Credentials")
        # segments: ['', (download|upload)?, 'storage', 'v1', 'b', B, 'o', NAME?]
        api = ""
        if len(segments) > 1 and segments[1] in ("download", "upload"):
            api = segments[1]
            segments = [""] + segments[2:]
        if len(segments) < 6 or segments[1:4] != ["storage", "v1", "b"] or segments[5] != "o":
            return self.error(404, "no such API path " + url.path)
        bucket = unquote(segments[4])
        if bucket not in st.buckets:
            return self.error(404, "The specified bucket does not exist.")
        name = unquote(segments[6]) if len(segments) > 6 else None
        if api == "upload":
            return self.upload(bucket, q, data)
        if name is None:
            if self.command == "GET":
                return self.list(bucket, q)
            return self.error(405, "method not allowed")
        if self.command == "DELETE":
            with st.lock:
                found = st.buckets[bucket].pop(name, None)
            return self.reply(204) if found is not None else self.error(404, "No such object: %s/%s" % (bucket, name))
        if self.command == "GET":
            if api == "download" or q.get("alt") == "media":
                return self.download(bucket, name, q)
            with st.lock:
                if name not in st.buckets[bucket]:
                    return self.error(404, "No such object: %s/%s" % (bucket, name))
                return self.reply(200, st.resource(bucket, name))
        return self.error(405, "method not allowed")

    def control(self, path, q):
        st = self.server.state
        if path == "/_control/fault":
            with st.lock:
                st.fault = {"mode": q.get("mode", "503"), "count": int(q.get("count", "1")),
                            "skip": int(q.get("skip", "0")), "match": q.get("match", "")}
            return self.reply(200, {"ok": True})
        if path == "/_control/state":
            with st.lock:
                objects = sum(len(b) for b in st.buckets.values())
                session_bytes = sum(len(s["data"]) for s in st.sessions.values())
                return self.reply(200, {"requests": st.requests, "sessions": len(st.sessions), "objects": objects,
                                        "session_bytes": session_bytes, "chunk_sizes": st.chunk_sizes})
        return self.error(404, "unknown control")

    def list(self, bucket, q):
        st = self.server.state
        prefix = q.get("prefix", "")
        limit = min(int(q.get("maxResults", "1000") or 1000), st.page_size)
        after = q.get("pageToken", "")
        with st.lock:
            names = sorted(n for n in st.buckets[bucket] if n.startswith(prefix) and n > after)
            page = names[:limit]
            out = {"kind": "storage#objects", "items": [st.resource(bucket, n) for n in page]}
        if not out["items"]:
            del out["items"]  # GCS omits an empty list
        if len(names) > limit:
            out["nextPageToken"] = page[-1]
        return self.reply(200, out)

    def download(self, bucket, name, q):
        st = self.server.state
        with st.lock:
            obj = st.buckets[bucket].get(name)
        if obj is None:
            return self.error(404, "No such object: %s/%s" % (bucket, name))
        data, gen = obj
        if "ifGenerationMatch" in q and q["ifGenerationMatch"] != str(gen):
            return self.error(412, "Precondition Failed")
        headers = {"x-goog-generation": str(gen)}
        rng = self.headers.get("Range")
        if rng is None:
            return self.reply(200, data, headers, "application/octet-stream")
        first, _, last = rng.removeprefix("bytes=").partition("-")
        first = int(first)
        last = min(int(last) if last else len(data) - 1, len(data) - 1)
        if first >= len(data):
            headers["Content-Range"] = "bytes */%d" % len(data)
            return self.error(416, "Requested range not satisfiable")
        headers["Content-Range"] = "bytes %d-%d/%d" % (first, last, len(data))
        return self.reply(206, data[first:last + 1], headers, "application/octet-stream")

    def upload(self, bucket, q, data):
        st = self.server.state
        kind = q.get("uploadType")
        if self.command == "POST" and kind == "media":
            if not q.get("name"):
                return self.error(400, "name is required")
            problem = hash_mismatch(self.headers.get("X-Goog-Hash"), data)
            if problem:
                return self.error(400, problem)
            resource = st.publish(bucket, q["name"], data, q.get("ifGenerationMatch"))
            if resource is None:
                return self.precondition_failed()
            return self.reply(200, resource)
        if self.command == "POST" and kind == "resumable":
            if not q.get("name"):
                return self.error(400, "name is required")
            match = q.get("ifGenerationMatch")
            with st.lock:
                refused = match is not None and st.generation_of(bucket, q["name"]) != int(match)
            if refused:
                return self.precondition_failed()
            sid = uuid.uuid4().hex
            with st.lock:
                st.sessions[sid] = {"bucket": bucket, "name": q["name"], "data": bytearray(), "match": match}
            host = self.headers.get("Host", "127.0.0.1:%d" % self.server.server_port)
            location = "http://%s/upload/storage/v1/b/%s/o?uploadType=resumable&name=%s&upload_id=%s" % (
                host, quote(bucket, safe=""), quote(q["name"], safe=""), sid)
            return self.reply(200, b"", {"Location": location})
        sid = q.get("upload_id")
        with st.lock:
            session = st.sessions.get(sid)
        if session is None:
            return self.error(404, "No such upload session")
        if self.command == "DELETE":
            with st.lock:
                st.sessions.pop(sid, None)
            return self.error(499, "Client Closed Request")
        if self.command != "PUT":
            return self.error(405, "method not allowed")
        return self.chunk(sid, session, data)

    def chunk(self, sid, session, data):
        st = self.server.state
        spec = self.headers.get("Content-Range", "").removeprefix("bytes ")
        span, _, total = spec.partition("/")
        buf = session["data"]
        with st.lock:
            st.chunk_sizes.append(len(data))
        new = b""
        if span != "*":
            first, _, last = span.partition("-")
            first, last = int(first), int(last)
            if last - first + 1 != len(data) or first > len(buf):
                return self.error(400, "Content-Range %s does not match the body or the session" % spec)
            if total == "*" and (last + 1) % CHUNK_QUANTUM != 0:
                return self.error(400, "non-final chunk does not end at a multiple of 256 KiB")
            new = data[len(buf) - first:]  # bytes already persisted are ignored
        if total != "*" and len(buf) + len(new) == int(total):
            whole = bytes(buf) + new
            problem = hash_mismatch(self.headers.get("X-Goog-Hash"), whole)
            if problem:
                return self.error(400, problem)  # the session keeps what it had before
            resource = st.publish(session["bucket"], session["name"], whole, session.get("match"))
            with st.lock:
                st.sessions.pop(sid, None)
            if resource is None:
                return self.precondition_failed()
            return self.reply(200, resource)
        if total != "*" and len(buf) + len(new) > int(total):
            return self.error(400, "more bytes than the declared total")
        buf += new
        headers = {"Range": "bytes=0-%d" % (len(buf) - 1)} if buf else {}
        return self.reply(308, b"", headers)

    do_GET = do_PUT = do_POST = do_DELETE = handle_any


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("token")
    parser.add_argument("buckets", nargs="+")
    parser.add_argument("--page-size", type=int, default=3)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.state = State(args.token, args.buckets, args.page_size)
    print("PORT %d" % server.server_port, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
