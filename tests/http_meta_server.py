#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A stand-in for Mooncake's HTTP metadata server (mooncake-wheel's
mooncake/http_metadata_server.py, `mooncake_http_metadata_server`), with its
semantics and only the standard library (that one needs aiohttp):

  GET    /metadata?key=K   200 the value, 404 "metadata not found"
  PUT    /metadata?key=K   200 "metadata updated" (body: the value)
  DELETE /metadata?key=K   200 "metadata deleted", 404 "metadata not found"
  no key                   400 "metadata key is required"
  another method           405; another path: 404

As Mooncake's, a key containing "rpc_meta" that exists already may only be
PUT again with the same value (else 400). The store is in memory: a
restarted server is empty.

Run: http_meta_server.py --port N [--host 127.0.0.1] [--path /metadata];
prints "listening HOST:PORT" once it accepts (port 0: a free one). Tests in
Python use serve() in a thread.
"""
import argparse
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as aiohttp serves
    # Headers and body leave in two writes; with Nagle on, each answer on a
    # kept-alive connection then waits for the client's delayed ACK (40 ms).
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):  # quiet
        pass

    def _answer(self, status, body):
        if isinstance(body, str):
            body = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _key(self):
        url = urlsplit(self.path)
        if url.path != self.server.meta_path:
            self._answer(404, "404: Not Found")
            return None
        key = parse_qs(url.query).get("key", [""])[0].strip()
        if not key:
            self._answer(400, "metadata key is required")
            return None
        return key

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def do_GET(self):
        key = self._key()
        if key is None:
            return
        with self.server.lock:
            value = self.server.store.get(key)
        if value is None:
            self._answer(404, "metadata not found")
        else:
            self._answer(200, value)

    def do_PUT(self):
        data = self._body()
        key = self._key()
        if key is None:
            return
        with self.server.lock:
            if "rpc_meta" in key and key in self.server.store:
                if self.server.store[key] == data:
                    self._answer(200, "metadata unchanged")
                else:
                    self._answer(400, "Duplicate rpc_meta key not allowed")
                return
            self.server.store[key] = data
        self._answer(200, "metadata updated")

    def do_DELETE(self):
        key = self._key()
        if key is None:
            return
        with self.server.lock:
            found = self.server.store.pop(key, None) is not None
        if found:
            self._answer(200, "metadata deleted")
        else:
            self._answer(404, "metadata not found")

    def do_POST(self):
        self._body()
        if self._key() is not None:
            self._answer(405, "Method not allowed")


def make_server(host="127.0.0.1", port=0, path="/metadata"):
    """A server bound to host:port (not yet serving): .server_address,
    .store (dict of bytes), .serve_forever(), .shutdown()."""
    srv = ThreadingHTTPServer((host, port), _Handler)
    srv.daemon_threads = True
    srv.meta_path = path
    srv.store = {}
    srv.lock = threading.Lock()
    return srv


def serve(host="127.0.0.1", port=0, path="/metadata"):
    """Starts a server in a daemon thread; returns it (call .shutdown() and
    .server_close() to stop)."""
    srv = make_server(host, port, path)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--path", default="/metadata")
    args = ap.parse_args()
    srv = make_server(args.host, args.port, args.path)
    print("listening %s:%d" % srv.server_address[:2], flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
