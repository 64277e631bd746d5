"""What ``gdacil serve`` refuses before a handler runs: foreign hosts and origins, bodies that
are not JSON, bodies over the size limit.

A browser sends "simple" cross-origin requests (an HTML form, ``fetch(..., {mode:
"no-cors"})``) without asking the server first, with a ``text/plain``, url-encoded or multipart
body; and a page whose domain is made to resolve to this machine (DNS rebinding) talks to the
server as if it were its own origin, naming its own domain in ``Host``. So :class:`RequestGuard`
answers, before any body is read:

- 400 to a ``Host`` that is not one of the server's names (the address it is bound to,
  ``localhost``, the names the deployer allows; any IP address when it is bound to all
  addresses, since a page can only send a bare address as ``Host`` when it was itself loaded
  from that address);
- 403 to a request that changes state (any method but GET, HEAD and OPTIONS) whose ``Origin``
  is not the server's own, or that the browser marks as cross-site (``Sec-Fetch-Site``);
- 415 to such a request whose body is not ``application/json``: no browser sends that type to
  another origin without a CORS preflight, which this server never grants.

Clients that are not browsers (curl, programs) send no ``Origin`` and pass when they send JSON.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from urllib.parse import urlsplit

__all__ = ["BodyLimit", "RequestGuard", "allowed_hosts", "send_error"]

#: Methods that never change a model
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: ``Sec-Fetch-Site`` values of requests a user made on this server's own pages, or typed
_SAME_SITE_FETCHES = frozenset({b"same-origin", b"none"})
#: Bind addresses that listen on every address of the machine
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})
_DEFAULT_PORTS = {"http": 80, "https": 443}


async def send_error(send, status: int, message: str, headers: Iterable = ()) -> None:
    """Answer ``{"error": message}`` with ``status`` (an ASGI response)."""
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


def allowed_hosts(bind: str, extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The ``Host`` names a server bound to ``bind`` answers: ``bind`` itself, ``localhost``
    and ``127.0.0.1``, then ``extra`` (exact names, ``*.example.com`` for every subdomain, or
    ``*`` for any host)."""
    names = [_bare(bind), "localhost", "127.0.0.1"]
    if bind in WILDCARD_BINDS:
        names.append("::1")
    for pattern in extra:
        pattern = pattern.strip().lower().rstrip(".")
        if not pattern or ("*" in pattern and pattern != "*" and not (
                pattern.startswith("*.") and "*" not in pattern[2:])):
            raise ValueError(f"--allowed-host {pattern!r} is not a host name, '*.domain' or '*'")
        names.append(pattern)
    return tuple(dict.fromkeys(n for n in names if n))


def _bare(host: str) -> str:
    """``host`` without brackets, lower case, without a trailing dot."""
    return host.strip().strip("[]").lower().rstrip(".")


def _split_host(value: str) -> tuple[str, int | None] | None:
    """``(name, port)`` of a ``Host`` header value (port None when absent), or None when it
    is malformed."""
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port = rest[1:] or None
    elif value.count(":") == 1:
        name, _, port = value.partition(":")
    elif ":" in value:
        return None
    else:
        name, port = value, None
    if port is not None and not (port.isdigit() and len(port) <= 5):
        return None
    return _bare(name), int(port) if port is not None else None


class RequestGuard:
    """ASGI middleware: the checks of this module's documentation.

    Parameters
    ----------
    app
        The ASGI application it guards.
    hosts : sequence of str
        The ``Host`` names answered (:func:`allowed_hosts`).
    any_address : bool
        Whether any IP address is answered as ``Host`` (the server is bound to all addresses).
    """

    def __init__(self, app, hosts: Iterable[str], any_address: bool = False):
        self.app, self.hosts, self.any_address = app, tuple(hosts), any_address

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        host = headers.get(b"host", b"").decode("latin-1")
        split = _split_host(host)
        if split is None or not self._host_allowed(split[0]):
            return await send_error(send, 400, (
                f"Host {host!r} is not a name this server answers to (it answers "
                f"{', '.join(self.hosts)}; name others with gdacil serve --allowed-host)"))
        if scope["method"] not in SAFE_METHODS:
            problem = _cross_site(headers, split)
            if problem:
                return await send_error(send, 403, problem)
            media = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
            if media != b"application/json" and not (media.startswith(b"application/")
                                                     and media.endswith(b"+json")):
                shown = media.decode("latin-1") or "none"
                return await send_error(send, 415, (
                    f"the body must be JSON sent with Content-Type: application/json (this "
                    f"request's Content-Type is {shown})"))
        return await self.app(scope, receive, send)

    def _host_allowed(self, name: str) -> bool:
        if name in self.hosts or "*" in self.hosts:
            return True
        if any(p.startswith("*.") and name.endswith(p[1:]) for p in self.hosts):
            return True
        if self.any_address:
            try:
                ipaddress.ip_address(name)
            except ValueError:
                return False
            return True
        return False


def _cross_site(headers: dict, host: tuple[str, int | None]) -> str | None:
    """Why a state-changing request comes from another site, or None."""
    fetch_site = headers.get(b"sec-fetch-site")
    if fetch_site is not None and fetch_site.lower() not in _SAME_SITE_FETCHES:
        return (f"a {fetch_site.decode('latin-1')} request from a browser page cannot change "
                "or query this model; send it from a page of this server or from a program")
    origin = headers.get(b"origin")
    if origin is None:
        return None
    shown = origin.decode("latin-1")
    try:
        parts = urlsplit(shown)
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:  # not a URL: no origin of ours
        parts, port = None, None
    name, host_port = host
    if (parts is not None and parts.scheme in _DEFAULT_PORTS and parts.hostname is not None
            and _bare(parts.hostname) == name
            and port == (host_port or _DEFAULT_PORTS[parts.scheme])):
        return None
    return (f"requests from the page of origin {shown!r} are refused: only this server's own "
            "origin may send them")


class BodyLimit:
    """ASGI middleware: answer 413 to a request whose body is over ``limit`` bytes, by its
    Content-Length or while it streams in."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await self._refuse(send)
        received, started, refused = 0, False, False

        async def limited_receive():
            # Over the limit: answer 413 now and tell the application the client has gone
            # (frameworks turn errors raised while reading a body into their own 400).
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                refused = True
                if not started:
                    await self._refuse(send)
                return {"type": "http.disconnect"}
            return message

        async def guarded_send(message):
            nonlocal started
            if refused:
                return  # the 413 has been sent
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not refused:
                raise

    async def _refuse(self, send):
        await send_error(send, 413, f"the request body is over {self.limit} bytes")
