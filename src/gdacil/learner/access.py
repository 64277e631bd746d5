"""Who may change a model that ``gdacil serve`` serves: a bearer token, or ``--allow-learn``.

A request that changes state (``POST /learn``, ``/rollback``, ``/inbox/{id}/label``,
``/inbox/{id}/discard``, ``/inbox/learn``) needs a grant:

- with a token (``gdacil serve --token-file FILE``, or the environment variable
  :data:`TOKEN_ENV`), it must carry ``Authorization: Bearer <token>``, and so must a request for
  the console's data (``GET /inbox``, ``GET /versions``); any other is answered 401 with
  ``WWW-Authenticate: Bearer``;
- without a token, state changes are refused (403) unless the server was started with
  ``--allow-learn``, when anyone who can reach it may make them.

The token travels only in that header, never in a cookie: a browser attaches cookies to the
requests any page sends, but no page of another origin can set this header on a request to the
server without a CORS preflight, which the server never grants (:mod:`gdacil.learner.guards`).
Tokens are compared in constant time (:func:`hmac.compare_digest`).
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["MIN_TOKEN_CHARS", "TOKEN_ENV", "Access", "read_token"]

#: The environment variable that holds the token when no ``--token-file`` is given
TOKEN_ENV = "GDACIL_TOKEN"
#: The shortest token accepted: 16 characters of a random token are about 95 bits
MIN_TOKEN_CHARS = 16
#: The challenge of a 401 answer
CHALLENGE = 'Bearer realm="gdacil"'


def check_token(token: str, where: str) -> str:
    """``token`` without surrounding whitespace, refused (``ValueError`` naming ``where``)
    unless it is at least :data:`MIN_TOKEN_CHARS` visible ASCII characters (what an HTTP header
    can carry)."""
    token = token.strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"{where}: the token has {len(token)} characters; at least "
                         f"{MIN_TOKEN_CHARS} (make one with: python -c \"import secrets; "
                         "print(secrets.token_urlsafe(32))\")")
    bad = next((c for c in token if not "!" <= c <= "~"), None)
    if bad is not None:
        raise ValueError(f"{where}: the token holds {bad!r}; a token is visible ASCII "
                         "characters only (no spaces)")
    return token


def read_token(token_file=None, environ: Mapping[str, str] | None = None) -> str | None:
    """The token of ``token_file`` (its text, surrounding whitespace stripped), else of the
    environment variable :data:`TOKEN_ENV`, else None.

    Examples
    --------
    >>> read_token(environ={"GDACIL_TOKEN": " correct-horse-battery-staple "})
    'correct-horse-battery-staple'
    >>> read_token(environ={}) is None
    True
    """
    if token_file is not None:
        path = Path(token_file).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"--token-file {path}: not UTF-8 text") from None
        except OSError as exc:
            raise ValueError(f"--token-file {path}: {exc.strerror or exc}") from None
        return check_token(text, f"--token-file {path}")
    environ = os.environ if environ is None else environ
    if environ.get(TOKEN_ENV) is None:
        return None
    return check_token(environ[TOKEN_ENV], f"environment variable {TOKEN_ENV}")


class Access:
    """The grant of a server: its ``token`` (None: none) and whether ``allow_learn``.

    Examples
    --------
    >>> access = Access(token="correct-horse-battery-staple")
    >>> access.refusal("Bearer correct-horse-battery-staple", change=True) is None
    True
    >>> access.refusal(None, change=True)[0]
    401
    >>> Access().refusal(None, change=True)[0]
    403
    >>> Access().refusal(None, change=False) is None
    True
    """

    def __init__(self, token: str | None = None, allow_learn: bool = False):
        self.token = None if token is None else check_token(token, "the token")
        self.allow_learn = allow_learn

    @property
    def can_change(self) -> bool:
        """Whether any request may change the model (with the token, when there is one)."""
        return self.token is not None or self.allow_learn

    def refusal(self, authorization: str | None, *, change: bool) -> tuple[int, str] | None:
        """``(status, message)`` refusing a request with the ``Authorization`` header
        ``authorization`` (None: none), or None when it is granted. ``change``: whether the
        request changes state (else it reads the console's data)."""
        if self.token is None:
            if change and not self.allow_learn:
                return 403, ("changing the model is not allowed on this server (start it with "
                             "--allow-learn, or --token-file to require a token)")
            return None
        scheme, _, given = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return 401, ("this server needs its token: send the header Authorization: Bearer "
                         "<token>")
        if not hmac.compare_digest(given.strip().encode("utf-8", "replace"),
                                   self.token.encode("ascii")):
            return 401, "the token sent in Authorization is not this server's token"
        return None
