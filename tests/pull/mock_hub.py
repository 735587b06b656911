#!/usr/bin/env python3
"""A stand-in for the Hugging Face hub, for the `deltafin pull` tests (never part of the product).

It serves the files of local folders (`deltafin make-model` checkpoints) as model repositories,
each at one commit, speaking the parts of the hub's HTTP protocol that a download uses:

  GET /api/models/REPO/revision/REV   {"id", "sha": COMMIT, "siblings": [{"rfilename"}]}
  GET /api/models/REPO/tree/REV?recursive=true
        a page of {"type": "file", "oid", "size", "path", "lfs"?}; the next page's URL in a
        `Link: <URL>; rel="next"` header (pages of --page-size entries). Large files (LFS) carry
        "lfs": {"oid": SHA256, "size", "pointerSize"} and a git oid of their pointer; small ones
        the git blob SHA-1 of their bytes as "oid".
  GET /REPO/resolve/REV/PATH          small files: 200 with the bytes; LFS files: 302 to
        /cdn/SHA256?sig=... with X-Repo-Commit, X-Linked-Etag, X-Linked-Size (as the hub does)
  GET /cdn/SHA256                     the bytes, with single-range requests (206, Content-Range)

REV may be the branch name "main" or the commit. With --token T every request but /cdn needs
"Authorization: Bearer T" (401 otherwise, as for a gated or private repository).

Faults are set with POST /_control (JSON, merged into the current settings) and counted by
GET /_stats, so a test can change them between runs:
  drop_after_bytes N, drop_count K   the next K body responses close the connection after N bytes
  slow_ms MS                         sleep MS before each 64 KiB of every body (a slow link)
  corrupt_path P, corrupt_count K    the next K responses for file P have one byte flipped
  error_status S, error_count K      the next K /cdn or resolve requests get status S (Retry-After 0)
A hostile hub, for the tests of what pull refuses or withstands:
  patch_entries {PATH: {...}}        merged into PATH's listed entry (its "lfs" object merged too),
                                     e.g. an oid that is a file name or a size of 2^63; what is
                                     served stays the real file
  extra_entries [{...}]              appended to the first page of the listing as they are
  endless_listing "fast" | "drip"    listing pages whose body never ends: as fast as possible, or
                                     2 KB/s (above libcurl's low-speed limit, so only a deadline
                                     stops it)
  endless_body true                  file bodies (200 or 206) that never end, past the range asked
  next_other_host true               each page's Link points at the other host (below)
  cdn_other_host true                resolve redirects LFS files to the other host's /cdn
The "other host" is a second listener on another port (another origin), serving the same
routes without asking for the token, as a host that only wants to see one would; it counts
other_requests and other_authorization (requests that carried an Authorization header).
Stats: requests, body_bytes (bytes of file content sent), per-kind counts.

Usage: mock_hub.py --repo ORG/NAME=DIR [--repo ...] --port-file FILE [--token T] [--page-size N]
The port it listens on (127.0.0.1, chosen by the OS) is written to --port-file once it serves.
"""
import argparse
import copy
import hashlib
import json
import os
import re
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"
LFS_MIN = 10 * 1024  # files this large are served as LFS objects (the hub's threshold is similar)


class Repo:
    def __init__(self, root, name):
        self.root, self.name, self.files = root, name, {}
        for base, _, names in os.walk(root):
            for n in sorted(names):
                full = os.path.join(base, n)
                rel = os.path.relpath(full, root)
                data = open(full, "rb").read()
                entry = {"type": "file", "size": len(data), "path": rel}
                blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
                if len(data) >= LFS_MIN:
                    sha = hashlib.sha256(data).hexdigest()
                    pointer = ("version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n"
                               % (sha, len(data))).encode()
                    entry["oid"] = hashlib.sha1(b"blob %d\0" % len(pointer) + pointer).hexdigest()
                    entry["lfs"] = {"oid": sha, "size": len(data), "pointerSize": len(pointer)}
                else:
                    entry["oid"] = blob
                self.files[rel] = (entry, full)
        self.by_sha = {e["lfs"]["oid"]: rel for rel, (e, _) in self.files.items() if "lfs" in e}


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.faults = {}
        self.other_port = 0
        self.stats = {"requests": 0, "body_bytes": 0, "tree": 0, "revision": 0, "resolve": 0,
                      "cdn": 0, "unauthorized": 0, "dropped": 0, "corrupted": 0, "errors": 0}

    def take(self, count_key):
        """Consumes one unit of a counted fault; True if it applies to this response."""
        with self.lock:
            n = int(self.faults.get(count_key, 0))
            if n <= 0:
                return False
            self.faults[count_key] = n - 1
            return True

    def count(self, key, n=1):
        with self.lock:
            self.stats[key] = self.stats.get(key, 0) + n


def merged(entry, patch):
    out = copy.deepcopy(entry)
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k].update(v)
        else:
            out[k] = v
    return out


def make_handler(repos, state, token, page_size):
    names = "|".join(re.escape(n) for n in repos)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # quiet
            pass

        def send_json(self, status, obj, extra=()):
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for k, v in extra:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def authorized(self):
            if getattr(self.server, "is_other", False):
                return True  # the other host asks for nothing: it only records what it is sent
            if token is None or self.headers.get("Authorization") == "Bearer " + token:
                return True
            state.count("unauthorized")
            self.send_json(401, {"error": "Invalid credentials in Authorization header"},
                           [("X-Error-Code", "GatedRepo")])
            return False

        def fault_status(self):
            if state.take("error_count"):
                state.count("errors")
                status = int(state.faults.get("error_status", 503))
                self.send_json(status, {"error": "injected %d" % status}, [("Retry-After", "0")])
                return True
            return False

        def do_POST(self):
            if self.path == "/_control":
                n = int(self.headers.get("Content-Length", 0))
                with state.lock:
                    state.faults.update(json.loads(self.rfile.read(n) or b"{}"))
                return self.send_json(200, state.faults)
            self.send_json(404, {"error": "not found"})

        def do_GET(self):
            state.count("requests")
            if getattr(self.server, "is_other", False):
                state.count("other_requests")
                if "Authorization" in self.headers:
                    state.count("other_authorization")
            url = urllib.parse.urlsplit(self.path)
            path = urllib.parse.unquote(url.path)
            if path == "/_stats":
                with state.lock:
                    return self.send_json(200, dict(state.stats))
            if re.fullmatch(r"/api/models/[^/]+/[^/]+/(revision|tree)/.*", path) and \
                    not re.fullmatch(r"/api/models/(%s)/.*" % names, path):
                if not self.authorized():
                    return
                return self.send_json(404, {"error": "Repository not found"},
                                      [("X-Error-Code", "RepoNotFound")])
            m = re.fullmatch(r"/api/models/(%s)/revision/([^/]+)" % names, path)
            if m:
                if not self.authorized():
                    return
                state.count("revision")
                repo = repos[m.group(1)]
                if m.group(2) not in ("main", COMMIT):
                    return self.send_json(404, {"error": "Invalid rev id: " + m.group(2)})
                return self.send_json(200, {"id": repo.name, "sha": COMMIT,
                                            "siblings": [{"rfilename": p} for p in sorted(repo.files)]})
            m = re.fullmatch(r"/api/models/(%s)/tree/([^/]+)" % names, path)
            if m:
                if not self.authorized():
                    return
                state.count("tree")
                repo = repos[m.group(1)]
                if m.group(2) not in ("main", COMMIT):
                    return self.send_json(404, {"error": "Invalid rev id: " + m.group(2)})
                endless = state.faults.get("endless_listing")
                if endless:
                    return self.send_endless(endless)
                query = urllib.parse.parse_qs(url.query)
                start = int(query.get("cursor", ["0"])[0])
                paths = sorted(repo.files)
                patches = state.faults.get("patch_entries", {})
                page = [merged(repo.files[n][0], patches.get(n, {}))
                        for n in paths[start:start + page_size]]
                if start == 0:
                    page += state.faults.get("extra_entries", [])
                extra = []
                if start + page_size < len(paths):
                    host = self.headers["Host"]
                    if state.faults.get("next_other_host"):
                        host = "127.0.0.1:%d" % state.other_port
                    nxt = "http://%s%s?recursive=true&cursor=%d" % (host, url.path,
                                                                    start + page_size)
                    extra.append(("Link", '<%s>; rel="next"' % nxt))
                return self.send_json(200, page, extra)
            m = re.fullmatch(r"/(%s)/resolve/([^/]+)/(.+)" % names, path)
            if m:
                if not self.authorized():
                    return
                state.count("resolve")
                if self.fault_status():
                    return
                repo, rel = repos[m.group(1)], m.group(3)
                if m.group(2) not in ("main", COMMIT) or rel not in repo.files:
                    return self.send_json(404, {"error": "Entry not found"},
                                          [("X-Error-Code", "EntryNotFound")])
                entry, full = repo.files[rel]
                if "lfs" in entry:
                    sha = entry["lfs"]["oid"]
                    self.send_response(302)
                    where = "/cdn/%s?sig=%d" % (sha, time.time_ns())
                    if state.faults.get("cdn_other_host"):
                        where = "http://127.0.0.1:%d%s" % (state.other_port, where)
                    self.send_header("Location", where)
                    self.send_header("X-Repo-Commit", COMMIT)
                    self.send_header("X-Linked-Etag", '"%s"' % sha)
                    self.send_header("X-Linked-Size", str(entry["size"]))
                    self.send_header("ETag", '"%s"' % entry["oid"])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                return self.send_file(rel, full, entry["size"])
            m = re.fullmatch(r"/cdn/([0-9a-f]{64})", path)
            owner = [r for r in repos.values() if m and m.group(1) in r.by_sha]
            if owner:
                state.count("cdn")
                if self.fault_status():
                    return
                rel = owner[0].by_sha[m.group(1)]
                entry, full = owner[0].files[rel]
                return self.send_file(rel, full, entry["size"])
            self.send_json(404, {"error": "not found: " + path})

        def send_endless(self, how):
            """A 200 listing whose body never ends (no length, the connection held open)."""
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            block = b"[" + b" " * 65535 if how == "fast" else b" " * 512
            try:
                while True:
                    self.wfile.write(block)
                    block = block.replace(b"[", b" ")
                    if how != "fast":
                        self.wfile.flush()
                        time.sleep(0.25)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def send_file(self, rel, full, size):
            begin, end, status = 0, size - 1, 200
            rng = self.headers.get("Range")
            if rng:
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
                if not m or int(m.group(1)) >= size:
                    self.send_response(416)
                    self.send_header("Content-Range", "bytes */%d" % size)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                begin = int(m.group(1))
                end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
                status = 206
            length = end - begin + 1
            if state.faults.get("endless_body"):
                self.send_response(status)
                if status == 206:
                    self.send_header("Content-Range", "bytes %d-%d/%d" % (begin, end, size))
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                try:
                    while True:
                        self.wfile.write(b"\0" * 65536)
                except (BrokenPipeError, ConnectionResetError):
                    return
            with open(full, "rb") as f:
                f.seek(begin)
                data = bytearray(f.read(length))
            if state.faults.get("corrupt_path") == rel and length > 0 and state.take("corrupt_count"):
                state.count("corrupted")
                data[length // 2] ^= 0x5A
            drop = state.take("drop_count")
            limit = int(state.faults.get("drop_after_bytes", 0)) if drop else length
            self.send_response(status)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(length))
            if status == 206:
                self.send_header("Content-Range", "bytes %d-%d/%d" % (begin, end, size))
            self.end_headers()
            sent = 0
            slow = float(state.faults.get("slow_ms", 0)) / 1000.0
            try:
                while sent < min(length, limit):
                    if slow:
                        time.sleep(slow)
                    n = min(65536, min(length, limit) - sent)
                    self.wfile.write(data[sent:sent + n])
                    sent += n
                    state.count("body_bytes", n)
                if drop:
                    state.count("dropped")
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

    return Handler


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # clients that drop their connection (the pull tests kill them) are expected


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", action="append", required=True, help="ORG/NAME=DIR")
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--token")
    ap.add_argument("--page-size", type=int, default=4)
    a = ap.parse_args()
    repos = {}
    for spec in a.repo:
        name, root = spec.split("=", 1)
        repos[name] = Repo(root, name)
    state = State()
    handler = make_handler(repos, state, a.token, a.page_size)
    other = QuietServer(("127.0.0.1", 0), handler)
    other.daemon_threads = True
    other.is_other = True
    state.other_port = other.server_address[1]
    threading.Thread(target=other.serve_forever, daemon=True).start()
    server = QuietServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    tmp = a.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(tmp, a.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
