"""busd over HTTP, as the operator commands and busd.testing reach it: a failed request is
one line and an exit code (busd.errors), whichever API answered.

The commands talk to a running busd over its admin HTTP API and its management (ATOM) API
(`--url`, or BUSD_URL), so they need nothing but the standard library and work against busd
in a container."""

from __future__ import annotations

import ssl
import urllib.error

import click

from busd.errors import EXIT_EXISTS, EXIT_FAILURE, EXIT_INVALID, EXIT_NOT_FOUND, EXIT_UNAVAILABLE

TIMEOUT_S = 60.0

# An HTTP answer's status as the commands' exit code; any other status is EXIT_FAILURE.
STATUS_EXITS = {
    400: EXIT_INVALID,
    401: EXIT_INVALID,
    403: EXIT_INVALID,
    404: EXIT_NOT_FOUND,
    409: EXIT_EXISTS,
    413: EXIT_INVALID,
    503: EXIT_UNAVAILABLE,
}


class ToolError(click.ClickException):
    """One line on stderr and an exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        # per instance, though newer click declares it a class variable
        setattr(self, "exit_code", exit_code)  # noqa: B010

    def show(self, file=None) -> None:
        click.echo(f"busd: error: {self.message}", err=True)


def tls_context(url: str, cafile: str | None) -> ssl.SSLContext | None:
    """For an https:// URL: the system's trusted roots, or `cafile` (busd's certificate)."""
    return ssl.create_default_context(cafile=cafile) if url.startswith("https://") else None


def unreachable(url: str, exc: BaseException) -> ToolError:
    """busd could not be reached at `url`: why, and what to do about an untrusted certificate."""
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, ssl.SSLCertVerificationError):
        return ToolError(
            f"{url} presented a certificate this machine does not trust: give "
            "busd's with --cacert or BUSD_CACERT (its path is in busd's start "
            "banner)",
            EXIT_UNAVAILABLE,
        )
    return ToolError(f"cannot reach busd at {url}: {reason}", EXIT_UNAVAILABLE)


def http_error(exc: urllib.error.HTTPError, message: str | None) -> ToolError:
    """A refused request: busd's own words (`message`, else the status's reason) and the
    status's exit code."""
    return ToolError(str(message or exc.reason), STATUS_EXITS.get(exc.code, EXIT_FAILURE))
