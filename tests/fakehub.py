"""A local stand-in for the Hugging Face Hub's HTTP API (the three endpoints snapshot_download
uses), so the real huggingface_hub client can run against it offline."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


def serve(root: Path, repo_id: str, commit: str = "c" * 40, sizes: dict[str, int] | None = None) -> ThreadingHTTPServer:
    """`sizes` overrides what the Hub reports for some files (the tree's size, and X-Linked-Size as the
    Hub sends for LFS files), so a repo can claim shards larger than any disk without holding them."""
    files = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    sizes = {f: (sizes or {}).get(f, len(d)) for f, d in files.items()}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code: int, body: bytes = b"", headers: tuple = ()) -> None:
            self.send_response(code)
            for key, value in headers:
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            server.requests.append((self.command, self.path, self.headers.get("Authorization")))
            path = unquote(urlparse(self.path).path)
            if path.startswith(f"/api/models/{repo_id}/tree/"):
                tree = [
                    {"type": "file", "path": f, "size": sizes[f], "oid": hashlib.sha1(d).hexdigest()}
                    for f, d in files.items()
                ]
                return self._send(200, json.dumps(tree).encode(), (("Content-Type", "application/json"),))
            if path.startswith(f"/api/models/{repo_id}/revision/"):
                info = {"id": repo_id, "sha": commit, "siblings": [{"rfilename": f} for f in files]}
                return self._send(200, json.dumps(info).encode(), (("Content-Type", "application/json"),))
            prefix = f"/{repo_id}/resolve/"
            if path.startswith(prefix):
                name = path[len(prefix) :].partition("/")[2]
                if name in files:
                    data = files[name]
                    etag = f'"{hashlib.sha256(data).hexdigest()}"'
                    headers = (("X-Repo-Commit", commit), ("ETag", etag), ("X-Linked-Size", str(sizes[name])))
                    return self._send(200, data, headers)
            self._send(404, b"{}")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.requests = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
