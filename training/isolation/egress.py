"""The egress guard: every outbound connection to a destination a person chose (a tracking server,
a W&B server, a webhook) is judged here, at the moment it is made, by the address it is made to.

A destination is refused when it is, or resolves to, a loopback, private, link-local, multicast,
unspecified, reserved or otherwise non-public address (IPv4 and IPv6; an IPv4-mapped, 6to4 or
NAT64 IPv6 address is judged by the IPv4 address inside it), unless an admin allows its host:
``EGRESS_ALLOWED_HOSTS`` is a comma-separated list of ``host`` (any port) or ``host:port``
entries, matched against the host as written in the URL (``[::1]:8080`` for IPv6). An allowed
entry is trusted wherever it resolves.

How a connection gets here: a small forward proxy on loopback (``EgressProxy``), started by the
process that sends. It speaks HTTP ``CONNECT`` (https: a tunnel, TLS stays end to end between the
client and the server, which the client verifies by its host name) and absolute-URI requests
(plain http). For each connection it resolves the host, judges every address, and connects to an
address it judged; nothing else resolves the name again, so a DNS answer that changes between a
check and the connection (rebinding) cannot slip past: the address connected to is the address
judged. Its connect timeout is ``CONNECT_TIMEOUT`` seconds and a tunnel idle for
``IDLE_TIMEOUT`` seconds is closed.

Why a proxy rather than pinning each library's connections: W&B's network calls are made by its
Go service ``wandb-core``, a separate process that no Python-side pinning reaches, and it takes a
proxy (``wandb.Settings(http_proxy=..., https_proxy=...)``, which it uses for every request, a
loopback destination included). So one mechanism serves every sender:

- wandb-core: those two settings, per run.
- requests (MLflow's client, apprise's webhooks): inside ``proxy.route()`` every request that
  requests sends in that thread goes through the proxy, whatever the environment or the library
  asked for; redirects included, since each hop is a new request. The environment
  (``HTTPS_PROXY``) is not used: it is process-wide, and the same process also talks to services
  an admin configured (a remote trainer, a vLLM server on loopback) that this guard must not
  judge. The route also bounds a request's timeouts and notes each answer's status code, so a
  failure is told in our words (``Route.failure``) and a remote's text is never repeated.

``check_url`` judges a URL up front (a form at save time, a tracker before it starts) so that a
refused destination gets a clear message before anything is sent; the proxy judges again at
every connection, which is the wall.
"""

from __future__ import annotations

import contextlib
import contextvars
import ipaddress
import os
import selectors
import socket
import socketserver
import threading
from dataclasses import dataclass, field
from typing import Iterator
from urllib.parse import urlsplit
from training.errors import EgressRefused

ALLOWED_HOSTS_ENV = "EGRESS_ALLOWED_HOSTS"
CONNECT_TIMEOUT = 10.0
IDLE_TIMEOUT = 120.0
READ_TIMEOUT = 60.0  # a request sent through a route with no read timeout of its own gets this one
MAX_HEAD_BYTES = 64 * 1024

# NAT64 prefixes carry an IPv4 destination in their last 32 bits (RFC 6052, RFC 8215).
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT (RFC 6598)


# -- which destinations -------------------------------------------------------------------------

def parse_allowed_hosts(text: str) -> tuple[str, ...]:
    """``EGRESS_ALLOWED_HOSTS``' entries, normalised (lower case). Raises ValueError naming a bad one."""
    entries = []
    for raw in text.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        host, port = _split_host_port(entry)
        if not host or any(c in host for c in "/@?#* ") or (port is not None and not 0 < port < 65536):
            raise ValueError(f"{raw.strip()!r} is not a host or host:port (e.g. mlflow.internal, 10.0.0.5:5000, [::1]:8080).")
        entries.append(entry)
    return tuple(entries)


def allowed_hosts() -> tuple[str, ...]:
    """The admin's allowed hosts, from the environment (the platform exports its setting there)."""
    return parse_allowed_hosts(os.environ.get(ALLOWED_HOSTS_ENV, ""))


def _split_host_port(text: str) -> tuple[str, int | None]:
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host, port = text, ""
    try:
        return host, int(port) if port else None
    except ValueError:
        return "", None


def _is_allowed(host: str, port: int, allowed: tuple[str, ...]) -> bool:
    host = host.lower().strip("[]").rstrip(".")
    written = f"[{host}]" if ":" in host else host
    return written in allowed or f"{written}:{port}" in allowed


def why_not_public(address: str) -> str | None:
    """What kind of address this is when it is not a public one (``"a loopback"``), else None."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or next(
            (ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) for net in _NAT64 if ip in net), None)
        if embedded is not None:
            return why_not_public(str(embedded))
    for kind, hit in (("an unspecified", ip.is_unspecified), ("a loopback", ip.is_loopback),
                      ("a link-local", ip.is_link_local), ("a multicast", ip.is_multicast),
                      ("a reserved", ip.is_reserved), ("a private", ip.is_private),
                      ("a shared (carrier-grade NAT)", ip.version == 4 and ip in _SHARED)):
        if hit:
            return kind
    return None if ip.is_global else "a non-public"


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (the name service, as the connection would use it)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


@dataclass(frozen=True)
class Guard:
    """Judges destinations against public addresses and the admin's allowed hosts."""

    allowed: tuple[str, ...] = field(default_factory=allowed_hosts)

    def allows_host(self, host: str, port: int) -> bool:
        """Whether an admin allowed ``host:port``, wherever it resolves."""
        return _is_allowed(host, port, self.allowed)

    def addresses(self, host: str, port: int) -> list[str]:
        """The addresses a connection to ``host:port`` may be made to. Raises EgressRefused."""
        host = host.strip("[]").rstrip(".")
        if not host:
            raise EgressRefused("refused by the egress guard: the URL names no host.")
        try:
            addresses = resolve(host, port)
        except (OSError, UnicodeError):
            raise EgressRefused(f"{host} does not resolve (no address found for it).") from None
        if self.allows_host(host, port):
            return addresses
        for address in addresses:
            kind = why_not_public(address)
            if kind:
                named = host if host == address else f"{host} resolves to {address}, which"
                raise EgressRefused(f"refused by the egress guard: {named} is {kind} address "
                                    f"(an admin may allow its host in {ALLOWED_HOSTS_ENV}).")
        return addresses

    def connect(self, host: str, port: int) -> socket.socket:
        """A connection to an address of ``host:port`` that was judged just now."""
        error: OSError | None = None
        for address in self.addresses(host, port):
            try:
                return socket.create_connection((address, port), timeout=CONNECT_TIMEOUT)
            except OSError as exc:
                error = exc
        reason = "timed out" if isinstance(error, TimeoutError) else "was refused or unreachable"
        raise ConnectionError(f"the connection to {host}:{port} {reason}.")

    def check_url(self, url: str, unresolved_ok: bool = False) -> None:
        """Judge an http(s) URL's destination now. ``unresolved_ok``: a host that does not resolve
        yet passes (a form at save time: every connection is judged again when it is made)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EgressRefused(f"{parts.scheme or 'a URL without a scheme'}:// is not an http(s) URL with a host.")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise EgressRefused("the URL's port is not a number from 1 to 65535.") from None
        try:
            self.addresses(parts.hostname, port)
        except EgressRefused as exc:
            if not (unresolved_ok and "does not resolve" in str(exc)):
                raise


def check_url(url: str, unresolved_ok: bool = False) -> None:
    """``Guard().check_url``, with the allowed hosts of the environment."""
    Guard().check_url(url, unresolved_ok=unresolved_ok)


# -- the proxy ----------------------------------------------------------------------------------

class EgressProxy:
    """A forward proxy on 127.0.0.1 that connects only where ``guard`` allows. ``refusals`` keeps,
    in our words, each destination it refused (for the sender's error message)."""

    def __init__(self, guard: Guard | None = None) -> None:
        self.guard = guard or Guard()
        self.refusals: list[str] = []
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.egress = self
        self._thread = threading.Thread(target=self._server.serve_forever, name="egress-proxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "EgressProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def route(self) -> Iterator["Route"]:
        """Send every request that requests makes in this block through this proxy."""
        _install_requests_route()
        route = Route(self)
        token = _route.set(route)
        try:
            yield route
        finally:
            _route.reset(token)

    def _open(self, host: str, port: int) -> socket.socket:
        try:
            return self.guard.connect(host, port)
        except EgressRefused as exc:
            self.refusals.append(str(exc))
            raise


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    egress: EgressProxy


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        client: socket.socket = self.request
        client.settimeout(IDLE_TIMEOUT)
        head, rest = _read_head(client)
        if head is None:
            return
        line, _, headers = head.partition(b"\r\n")
        try:
            method, target, version = line.decode("latin-1").split(" ", 2)
        except ValueError:
            return _answer(client, 400, "a proxy request line is METHOD TARGET VERSION.")
        if method == "CONNECT":
            host, port = _split_host_port(target)
            first = b""
        else:
            parts = urlsplit(target)
            if parts.scheme != "http" or not parts.hostname:
                return _answer(client, 400, "only absolute http:// requests and CONNECT are proxied.")
            host, port = parts.hostname, parts.port or 80
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            kept = [h for h in headers.split(b"\r\n") if h and not h.lower().startswith((b"proxy-", b"connection:", b"keep-alive:"))]
            first = b"\r\n".join([f"{method} {path} {version}".encode("latin-1"), *kept, b"Connection: close", b"", b""])
        if not host or not port:
            return _answer(client, 400, "the request names no host and port.")
        try:
            upstream = self.server.egress._open(host, port)
        except EgressRefused as exc:
            return _answer(client, 403, str(exc))
        except (ConnectionError, OSError) as exc:
            return _answer(client, 502, str(exc) if isinstance(exc, ConnectionError) else f"could not connect to {host}:{port}.")
        with upstream:
            if method == "CONNECT":
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            upstream.sendall(first + rest)
            _relay(client, upstream)


def _read_head(sock: socket.socket) -> tuple[bytes | None, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD_BYTES:
            _answer(sock, 431, "the request's head is too long.")
            return None, b""
        try:
            chunk = sock.recv(65536)
        except OSError:
            return None, b""
        if not chunk:
            return None, b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _answer(sock: socket.socket, status: int, text: str) -> None:
    reasons = {400: "Bad Request", 403: "Forbidden", 431: "Request Header Fields Too Large", 502: "Bad Gateway"}
    body = text.encode()
    head = f"HTTP/1.1 {status} {reasons[status]}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    with contextlib.suppress(OSError):
        sock.sendall(head.encode() + body)


def _relay(client: socket.socket, upstream: socket.socket) -> None:
    """Copy bytes both ways until either side closes or both are idle for IDLE_TIMEOUT seconds."""
    selector = selectors.DefaultSelector()
    selector.register(client, selectors.EVENT_READ, upstream)
    selector.register(upstream, selectors.EVENT_READ, client)
    try:
        while True:
            ready = selector.select(IDLE_TIMEOUT)
            if not ready:
                return
            for key, _ in ready:
                try:
                    data = key.fileobj.recv(65536)
                    if not data:
                        return
                    key.data.sendall(data)
                except OSError:
                    return
    finally:
        selector.close()


# -- requests, routed through a proxy -----------------------------------------------------------

@dataclass
class Route:
    """What happened to the requests sent through one ``EgressProxy.route()`` block."""

    proxy: EgressProxy
    statuses: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def failure(self, what: str) -> str:
        """Why sending to ``what`` failed, in our words: the guard's refusal, the status code the
        remote answered, or how the connection failed. Never a remote's text."""
        if self.proxy.refusals:
            return f"{what}: {self.proxy.refusals[-1]}"
        failed = [code for code in self.statuses if code >= 300]
        if failed:
            return f"{what}: the server answered HTTP {failed[-1]}."
        if self.errors:
            return f"{what}: {self.errors[-1]}"
        return f"{what}: it failed (no answer from the server was kept)."


_route: contextvars.ContextVar[Route | None] = contextvars.ContextVar("egress_route", default=None)
_install_lock = threading.Lock()


def _install_requests_route() -> None:
    """Once per process: requests' adapter sends through the route's proxy while one is active.
    ``HTTPAdapter.send`` is where requests picks a proxy for each request (redirects included);
    outside a route it behaves exactly as before."""
    import requests
    from requests.adapters import HTTPAdapter

    with _install_lock:
        if getattr(HTTPAdapter.send, "egress_route", False):
            return
        original = HTTPAdapter.send

        def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):
            route = _route.get()
            if route is None:
                return original(self, request, stream=stream, timeout=timeout, verify=verify, cert=cert, proxies=proxies)
            connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
            bounded = (min(connect or CONNECT_TIMEOUT, CONNECT_TIMEOUT), min(read or READ_TIMEOUT, READ_TIMEOUT))
            try:
                response = original(self, request, stream=stream, timeout=bounded, verify=verify, cert=cert,
                                    proxies={"http": route.proxy.url, "https": route.proxy.url})
            except requests.Timeout:
                route.errors.append(f"no answer within {bounded[1]:g} s (timed out).")
                raise
            except requests.ConnectionError:
                route.errors.append("the connection failed.")
                raise
            route.statuses.append(response.status_code)
            return response

        send.egress_route = True  # type: ignore[attr-defined]
        HTTPAdapter.send = send
