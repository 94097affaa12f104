"""A fault-injecting HTTP proxy for shardpoint's object-store tests.

Sits between a driver and a real test server (moto for S3, Azurite, gcs_json_server.py):
every request is forwarded unchanged (Host and signatures included) over its own upstream
connection, and the answer goes back to the client on the client's kept-alive connection,
unless a fault scheduled for that request damages it. Faults are what real servers and
networks send:

  overlong    the response, then (after 100 ms, once the client has read the body) junk
              bytes on the same connection: a client that reuses it reads them as the next
              status line ("Received HTTP/0.9 when not allowed")
  longbody    a body longer than asked for, with a Content-Length that matches it
  truncate    Content-Length as sent upstream (64 bytes more for an empty body), half the
              body, then the connection closes
  short206    a 206 for only the first half of the asked range (Content-Range and
              Content-Length consistent with the shorter body)
  wrongrange  a 206 whose Content-Range starts one byte later than asked (same length)
  garbage     a garbage status line, then the connection closes
  reset       as truncate, then a TCP reset instead of a close
  500         HTTP 500 InternalError (not forwarded: the server did nothing)
  503         HTTP 503 SlowDown, S3's XML throttling answer (not forwarded)
  429         HTTP 429 Too Many Requests (not forwarded)
  slow        the response is held --slow-seconds before its first byte
  nosuchupload  HTTP 404 NoSuchUpload, S3's answer to a completion retried after the upload
              was completed (not forwarded)
  lost        the request is forwarded and carried out, then the connection closes with no
              answer (an answer lost after the server acted)
  damagebody  the request is forwarded with one byte in the middle of its body flipped
              (Content-Length and every header unchanged: a body damaged on the way, which
              only a checksum of the body can reveal); requests without a body are not
              faulted by such a rule and do not count as faults

Schedule: POST /_proxy/faults with one rule a line, "<selector> <first> <count> <kind>":
requests that match selector (GET, PUT, POST, DELETE, HEAD, RGET = GET with a Range or
x-ms-range header, ANY) are numbered from 1 since the schedule was set; numbers first ..
first + count - 1 get the fault (count 0: every one from first on). The first matching rule
wins. Posting a schedule resets the numbering and the counts. GET /_proxy/stats returns
{"requests": {selector: n}, "bytes": {selector: response body bytes the server sent},
"faults": {kind: n}, "log": ["kind METHOD path", ...]}.

Usage: python3 fault_proxy.py UPSTREAM [--slow-seconds S]   (UPSTREAM: http://host:port)
Binds 127.0.0.1 on a free port and prints "PORT <n>" on stdout.
"""
import http.client
import json
import socket
import socketserver
import struct
import sys
import threading
import time
from urllib.parse import urlsplit

KINDS = {"overlong", "longbody", "truncate", "short206", "wrongrange", "garbage", "reset",
         "500", "503", "429", "slow", "lost", "nosuchupload", "damagebody"}
SELECTORS = {"GET", "PUT", "POST", "DELETE", "HEAD", "RGET", "ANY"}
HOP_HEADERS = {"connection", "keep-alive", "expect", "proxy-connection", "te", "upgrade"}

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b'<Message>Please reduce your request rate.</Message><RequestId>FAULTPROXY</RequestId></Error>')
NO_SUCH_UPLOAD = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NoSuchUpload</Code>'
                  b'<Message>The specified upload does not exist.</Message><RequestId>FAULTPROXY</RequestId></Error>')
INTERNAL = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
            b'<Message>We encountered an internal error. Please try again.</Message>'
            b'<RequestId>FAULTPROXY</RequestId></Error>')


def selectors(method, ranged):
    """The selectors a request matches: ANY, its method, and RGET for a ranged GET."""
    return ("ANY", method) + (("RGET",) if ranged else ())


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.rules = []
        self.requests = {}
        self.bytes = {}
        self.faults = {}
        self.log = []

    def set_rules(self, text):
        rules = []
        for line in text.splitlines():
            if not line.strip():
                continue
            selector, first, count, kind = line.split()
            if selector not in SELECTORS or kind not in KINDS:
                raise ValueError("bad rule: " + line)
            rules.append((selector, int(first), int(count), kind))
        with self.lock:
            self.rules, self.requests, self.bytes, self.faults, self.log = rules, {}, {}, {}, []

    def fault_for(self, method, ranged, path, has_body):
        """Numbers the request under each selector it matches; returns its fault or None."""
        with self.lock:
            numbers = {}
            for sel in selectors(method, ranged):
                self.requests[sel] = self.requests.get(sel, 0) + 1
                numbers[sel] = self.requests[sel]
            for selector, first, count, kind in self.rules:
                if kind == "damagebody" and not has_body:
                    continue
                n = numbers.get(selector)
                if n is not None and n >= first and (count == 0 or n < first + count):
                    self.faults[kind] = self.faults.get(kind, 0) + 1
                    self.log.append("%s %s %s" % (kind, method, path))
                    return kind
            return None

    def count_body(self, method, ranged, nbytes):
        """Adds the bytes of a response body the server sent under each selector the request matched."""
        with self.lock:
            for sel in selectors(method, ranged):
                self.bytes[sel] = self.bytes.get(sel, 0) + nbytes

    def stats(self):
        with self.lock:
            return {"requests": dict(self.requests), "bytes": dict(self.bytes), "faults": dict(self.faults),
                    "log": list(self.log)}


def read_request(rfile):
    line = rfile.readline(65537)
    if not line:
        return None
    method, target, _ = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    headers = []
    while True:
        h = rfile.readline(65537)
        if h in (b"\r\n", b"\n", b""):
            break
        name, _, value = h.decode("latin-1").rstrip("\r\n").partition(":")
        headers.append((name.strip(), value.strip()))
    lower = {k.lower(): v for k, v in headers}
    if "chunked" in lower.get("transfer-encoding", "").lower():
        raise ValueError("chunked request bodies are not supported")
    body = rfile.read(int(lower.get("content-length", "0") or 0))
    return method, target, headers, lower, body


def status_line(status, reason):
    return ("HTTP/1.1 %d %s\r\n" % (status, reason)).encode("latin-1")


def header_block(headers):
    return b"".join(("%s: %s\r\n" % (k, v)).encode("latin-1") for k, v in headers) + b"\r\n"


class Handler(socketserver.StreamRequestHandler):
    def handle(self):
        try:
            while True:
                req = read_request(self.rfile)
                if req is None:
                    return
                if not self.serve(*req):
                    return
        except (ConnectionError, BrokenPipeError, socket.timeout, OSError, ValueError):
            return

    def send(self, data):
        self.connection.sendall(data)

    def reply(self, status, reason, body, extra=()):
        headers = [("Content-Length", str(len(body)))] + list(extra)
        self.send(status_line(status, reason) + header_block(headers) + body)

    def serve(self, method, target, headers, lower, body):
        """Answers one request; False when the connection is to be closed."""
        state = self.server.state
        if target.startswith("/_proxy/"):
            if method == "POST" and target == "/_proxy/faults":
                state.set_rules(body.decode())
                self.reply(200, "OK", b"{}")
            else:
                self.reply(200, "OK", json.dumps(state.stats()).encode())
            return True
        ranged = method == "GET" and ("range" in lower or "x-ms-range" in lower)
        kind = state.fault_for(method, ranged, target.partition("?")[0], len(body) > 0)
        if kind == "500":
            self.reply(500, "Internal Server Error", INTERNAL, [("Content-Type", "application/xml")])
            return True
        if kind == "503":
            self.reply(503, "Slow Down", SLOW_DOWN, [("Content-Type", "application/xml")])
            return True
        if kind == "nosuchupload":
            # What S3 answers a CompleteMultipartUpload retried after the first one completed.
            self.reply(404, "Not Found", NO_SUCH_UPLOAD, [("Content-Type", "application/xml")])
            return True
        if kind == "429":
            self.reply(429, "Too Many Requests", b"rate limit exceeded", [("Retry-After", "0")])
            return True

        if kind == "damagebody":
            middle = len(body) // 2
            body = body[:middle] + bytes([body[middle] ^ 0x5A]) + body[middle + 1:]
        status, reason, up_headers, up_body = self.forward(method, target, headers, body)
        state.count_body(method, ranged, len(up_body))
        if kind == "lost":
            # The server did the work; its answer never reaches the client.
            return False
        out = [(k, v) for k, v in up_headers
               if k.lower() not in HOP_HEADERS and k.lower() not in ("content-length", "transfer-encoding")]
        head_only = method == "HEAD" or status in (204, 304)
        if head_only:
            length = next((v for k, v in up_headers if k.lower() == "content-length"), None)
            if length is not None and status != 204:
                out.append(("Content-Length", length))
        else:
            out.append(("Content-Length", str(len(up_body))))

        if kind == "slow":
            time.sleep(self.server.slow_seconds)
        elif kind == "garbage":
            self.send(b"\x16\x03garbage status line\r\n\r\n")
            return False
        elif kind in ("truncate", "reset"):
            # Half the body (an empty body claims 64 bytes it never sends: with nothing after
            # the headers, libcurl would resend the request by itself), then FIN or RST.
            if len(up_body) < 2:
                out = [(k, v) for k, v in out if k.lower() != "content-length"]
                out.append(("Content-Length", str(len(up_body) + 64)))
            self.send(status_line(status, reason) + header_block(out) + up_body[:len(up_body) // 2])
            if kind == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        elif kind == "longbody" and status in (200, 206):
            up_body = up_body + b"L" * 100
            out = [(k, v) for k, v in out if k.lower() != "content-length"]
            out.append(("Content-Length", str(len(up_body))))
        elif kind in ("short206", "wrongrange") and status == 206:
            first, last, total = parse_content_range(up_headers)
            if kind == "short206" and last > first:
                last = first + (last - first + 1) // 2 - 1
                up_body = up_body[:last - first + 1]
            elif kind == "wrongrange":
                first, last = first + 1, last + 1
            out = [(k, v) for k, v in out if k.lower() not in ("content-length", "content-range")]
            out += [("Content-Range", "bytes %d-%d/%s" % (first, last, total)),
                    ("Content-Length", str(len(up_body)))]
        self.send(status_line(status, reason) + header_block(out) + (b"" if head_only else up_body))
        if kind == "overlong":
            time.sleep(0.1)
            self.send(b"JUNK-AFTER-BODY\r\n")
        return True

    def forward(self, method, target, headers, body):
        conn = http.client.HTTPConnection(self.server.upstream_host, self.server.upstream_port, timeout=60)
        try:
            conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for k, v in headers:
                if k.lower() not in HOP_HEADERS:
                    conn.putheader(k, v)
            conn.endheaders(body if body else None)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.reason, resp.getheaders(), data
        finally:
            conn.close()


def parse_content_range(headers):
    value = next((v for k, v in headers if k.lower() == "content-range"), "bytes 0-0/*")
    span, _, total = value.removeprefix("bytes ").partition("/")
    first, _, last = span.partition("-")
    return int(first), int(last), total


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    upstream = urlsplit(sys.argv[1])
    slow = 3.0
    if "--slow-seconds" in sys.argv:
        slow = float(sys.argv[sys.argv.index("--slow-seconds") + 1])
    server = Server(("127.0.0.1", 0), Handler)
    server.state = State()
    server.upstream_host = upstream.hostname
    server.upstream_port = upstream.port or 80
    server.slow_seconds = slow
    print("PORT %d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
