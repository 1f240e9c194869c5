"""The shared secret in front of sandboxd: where it comes from and when a daemon may go without it.

What it does: `load_token(token_file)` reads the token from a file (`--token-file`,
`--sandbox-token-file`) or, without one, from $RSTAR2_SANDBOX_TOKEN, so that daemons and clients
started by the same launcher agree on it. A token file must be a non-empty single line of printable
ASCII, and, as ssh demands of private keys, open to its owner only (mode 600): one that others
may read is refused rather than trusted. `check_bind` refuses a daemon that would listen beyond
loopback without a token, unless its operator said `--insecure-no-auth`. `token_matches`
compares in constant time.

`SandboxUnauthorized` is what a client raises on a 401 (here, so that callers can catch it
without importing the HTTP client).

What it does not: no HTTP (sandboxd.server checks the header, sandboxd.client sends it); the token
is never put into a message, a repr or a log line here.

Tested in tests/sandboxd/test_auth.py (files, modes, the variable, the bind rule, real daemons).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import stat
from pathlib import Path

TOKEN_ENV = "RSTAR2_SANDBOX_TOKEN"
MAKE_TOKEN = (
    '(umask 077; python -c "import secrets; print(secrets.token_urlsafe(32))" > sandbox.token)'
)


class TokenError(ValueError):
    """A token file or variable that cannot be used; the message never holds the token."""


class SandboxUnauthorized(RuntimeError):
    """A daemon answered 401: the token is missing or is not the daemon's (a setup error)."""

    @classmethod
    def at(cls, url: str, sent_token: bool) -> SandboxUnauthorized:
        what = "refused the token sent" if sent_token else "needs a token and none was sent"
        return cls(
            f"the sandbox at {url} answered 401 Unauthorized: it {what} "
            f"(--sandbox-token-file PATH or ${TOKEN_ENV})"
        )


def load_token(token_file: str | os.PathLike[str] | None) -> str | None:
    """The token from `token_file` when given, else from $RSTAR2_SANDBOX_TOKEN, else None."""
    if token_file is not None:
        return _read_token_file(Path(token_file))
    value = os.environ.get(TOKEN_ENV)
    if value is None:
        return None
    return _checked(value, f"${TOKEN_ENV}")


def _read_token_file(path: Path) -> str:
    try:
        mode = path.stat().st_mode
        if stat.S_ISREG(mode) and mode & 0o077:
            raise TokenError(
                f"token file {path} may be read by other users (mode {stat.S_IMODE(mode):o}); "
                f"run chmod 600 {path}"
            )
        text = path.read_text(encoding="ascii")
    except TokenError:
        raise
    except UnicodeDecodeError:
        raise TokenError(f"token file {path} is not ASCII text") from None
    except OSError as exc:
        raise TokenError(f"cannot read token file {path}: {exc.strerror or exc}") from None
    return _checked(text, f"token file {path}")


def _checked(text: str, where: str) -> str:
    token = text.strip()
    if not token:
        raise TokenError(f"{where} is empty; make a token with {MAKE_TOKEN}")
    if not (token.isascii() and token.isprintable()) or any(c.isspace() for c in token):
        raise TokenError(f"{where} must hold one word of printable ASCII (no spaces)")
    return token


def token_matches(header: str | None, token: str) -> bool:
    """Whether an `Authorization` header value is `Bearer <token>` (constant-time compare)."""
    if header is None:
        return False
    scheme, _, given = header.partition(" ")
    # NOTE: compare_digest on bytes: its time does not depend on where the strings first differ
    good = hmac.compare_digest(given.strip().encode("utf-8", "replace"), token.encode("ascii"))
    return good and scheme.lower() == "bearer"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost, or "" (every address)
        return False


def check_bind(host: str, token: str | None, insecure_no_auth: bool) -> None:
    """Raise TokenError (one line) when this daemon may not start as asked."""
    if token is not None and insecure_no_auth:
        raise TokenError(
            f"--insecure-no-auth and a token (--token-file or ${TOKEN_ENV}) exclude each other"
        )
    if token is None and not insecure_no_auth and not is_loopback(host):
        raise TokenError(
            f"refusing to serve {host or 'every address'} without a token: make one with "
            f"{MAKE_TOKEN} and pass --token-file sandbox.token (or set ${TOKEN_ENV}); "
            "--insecure-no-auth serves anyone who reaches the port"
        )


def auth_summary(token: str | None, insecure_no_auth: bool) -> str:
    """The startup line's word on access control."""
    if token is not None:
        return "bearer token"
    if insecure_no_auth:
        return "NONE (--insecure-no-auth: anyone who reaches the port runs code)"
    return "none (loopback only)"
