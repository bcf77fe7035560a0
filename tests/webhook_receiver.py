"""A real webhook receiver on loopback for the alerts' tests and benchmark (http.server).

In a test: ``Receiver(secret, delay=0, status=200).start()`` serves on 127.0.0.1 (a port the
kernel chose, or ``port``) from a thread and keeps every POST it took (``posts``), checking
its signature with the verifier docs/reference.md gives a receiver. As a process (the
benchmark): ``python -m tests.webhook_receiver SECRET PORT_FILE LOG`` appends a line of JSON
per POST to LOG: the time it arrived (``time.time()``), whether its signature held, its body.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.helpers import PROJECT


def doc_verifier() -> Any:
    """The ``verify`` function docs/reference.md shows a receiver: the test runs the docs' code."""
    text = (PROJECT / "docs" / "reference.md").read_text()
    start = text.index("```python\nimport hashlib, hmac, time")
    code = text[start + len("```python\n") : text.index("```", start + 10)]
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/reference.md", "exec"), namespace)  # noqa: S102 - our own docs, tested
    return namespace["verify"]


@dataclasses.dataclass
class Post:
    body: bytes
    headers: dict[str, str]
    verified: bool
    at: float

    @property
    def json(self) -> dict[str, Any]:
        return json.loads(self.body)


class Receiver:
    def __init__(self, secret: str, *, delay: float = 0, status: int = 200, port: int = 0) -> None:
        self.secret, self.delay, self.status, self.port = secret, delay, status, port
        self.posts: list[Post] = []
        self.verify = doc_verifier()
        self.server: http.server.ThreadingHTTPServer | None = None

    def start(self) -> Receiver:
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                arrived = time.time()
                if receiver.delay:
                    time.sleep(receiver.delay)
                verified = receiver.verify(body, self.headers.get("Callproof-Signature", ""), receiver.secret)
                receiver.posts.append(Post(body, dict(self.headers), verified, arrived))
                self.send_response(receiver.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def main() -> None:
    secret, port_file, log = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    receiver = Receiver(secret).start()
    port_file.write_text(str(receiver.port))
    seen = 0
    try:
        while True:
            time.sleep(0.05)
            for post in receiver.posts[seen:]:
                with log.open("a") as out:
                    out.write(json.dumps({"at": post.at, "verified": post.verified, "body": post.json}) + "\n")
            seen = len(receiver.posts)
    except KeyboardInterrupt:
        receiver.stop()


if __name__ == "__main__":
    main()
