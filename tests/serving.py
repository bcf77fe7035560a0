"""Serving the dashboard for real in a test: a free port, waiting for a server, stopping it,
and a client with its own source address and cookies."""

from __future__ import annotations

import http.client
import re
import signal
import socket
import ssl
import subprocess
import time
import urllib.parse


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(port: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            assert process.stderr is not None
            raise AssertionError(f"{process.args!r} exited: {process.stderr.read().decode()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if process.stderr is not None:
        process.stderr.close()


class Browser:
    """One client on its own source address, with its own cookies; over HTTPS when given the
    site's TLS context. Like a browser, a form it sends says where from (Origin, Referer), the
    port included: what a proxy passes on must keep it."""

    def __init__(self, port: int, address: str, tls: ssl.SSLContext | None = None) -> None:
        self.port, self.address, self.tls = port, address, tls
        self.cookies: dict[str, str] = {}

    @property
    def origin(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def request(self, method: str, path: str, body: dict | None = None, headers: dict | None = None):
        source = (self.address, 0)
        connection = (
            http.client.HTTPSConnection("127.0.0.1", self.port, timeout=30, source_address=source, context=self.tls)
            if self.tls
            else http.client.HTTPConnection("127.0.0.1", self.port, timeout=30, source_address=source)
        )
        sent = {"Host": f"127.0.0.1:{self.port}", **(headers or {})}
        if method == "POST":
            sent = {"Origin": self.origin, "Referer": f"{self.origin}{path}", **sent}
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{name}={value}" for name, value in self.cookies.items())
        data = urllib.parse.urlencode(body).encode() if body is not None else None
        if data is not None:
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        connection.request(method, path, body=data, headers=sent)
        response = connection.getresponse()
        text = response.read().decode(errors="replace")
        for header in response.headers.get_all("Set-Cookie") or []:
            name, _, rest = header.partition("=")
            self.cookies[name] = rest.split(";", 1)[0]
        connection.close()
        return response.status, text

    def log_in(self, password: str, forwarded_for: str | None = None, username: str = "alice") -> int:
        _, page = self.request("GET", "/accounts/login/")
        found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert found, page
        token = found.group(1)
        headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
        form = {"username": username, "password": password, "csrfmiddlewaretoken": token}
        status, _ = self.request("POST", "/accounts/login/", form, headers)
        return status
