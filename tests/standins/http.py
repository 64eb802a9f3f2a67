"""A loopback HTTP server for the stand-in services (stdlib ``ThreadingHTTPServer`` on 127.0.0.1)."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

Route = Callable[["Request"], "Response"]


class Request:
    def __init__(self, method: str, path: str, headers: Any, body: bytes) -> None:
        self.method, self.headers, self.body = method, headers, body
        self.path, _, self.query = path.partition("?")

    def json(self) -> Any:
        return json.loads(self.body or b"{}")


class Response:
    def __init__(self, status: int = 200, body: Any = None, content_type: str = "application/json",
                 raw: bytes | None = None, stream: list[bytes] | None = None) -> None:
        self.status, self.content_type, self.stream = status, content_type, stream
        self.raw = raw if raw is not None else (b"" if body is None and stream else json.dumps(body if body is not None else {}).encode())


class LoopbackServer:
    """Serves ``handle(request) -> Response`` on an ephemeral port until ``close``. Every request is
    logged in ``calls`` as (method, path) so tests can assert what the client did."""

    def __init__(self, handle: Route) -> None:
        self.calls: list[tuple[str, str]] = []
        self.errors: list[str] = []
        self.in_flight = 0
        self._idle = threading.Condition()
        self._connections: set = set()  # open client connections, each served by a thread of its own
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with server._idle:
                    server._connections.add(self.connection)

            def finish(self) -> None:
                with server._idle:
                    server._connections.discard(self.connection)
                super().finish()

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                request = Request(self.command, self.path, self.headers, body)
                server.calls.append((self.command, request.path))
                with server._idle:
                    server.in_flight += 1
                try:
                    response = handle(request)
                except Exception as exc:  # a stand-in bug: answer 500 and keep it for the test to see
                    server.errors.append(f"{self.command} {request.path}: {exc!r}")
                    response = Response(500, {"detail": f"stand-in error: {exc!r}"})
                finally:
                    with server._idle:
                        server.in_flight -= 1
                        server._idle.notify_all()
                self.send_response(response.status)
                self.send_header("Content-Type", response.content_type)
                if response.stream is not None:
                    payload = b"".join(response.stream)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                self.send_header("Content-Length", str(len(response.raw)))
                self.end_headers()
                self.wfile.write(response.raw)

            do_GET = do_POST = do_DELETE = do_PATCH = _serve

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        """Stop serving and wait (10 s at most) for requests still being handled, so no stand-in keeps
        sampling, and drawing from torch's global RNG, after its test has ended. Idle keep-alive
        connections are closed: each held a thread and two sockets in the test's process for as long
        as the client kept it (a tinker run's client left some 70, and a test process that ran the
        tinker tests held over 1,000 descriptors)."""
        self.httpd.shutdown()
        self.httpd.server_close()
        with self._idle:
            self._idle.wait_for(lambda: self.in_flight == 0, timeout=10)
            for connection in list(self._connections):
                try:
                    connection.shutdown(socket.SHUT_RDWR)  # its thread reads the end and closes it
                except OSError:
                    pass
