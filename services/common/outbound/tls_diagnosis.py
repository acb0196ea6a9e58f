"""Why a gRPC call could not reach a server: a TLS probe run only after a call failed UNAVAILABLE.

grpc reports every TLS failure to the caller as the same "UNAVAILABLE ... Socket closed". This module
dials the address once more with Python's `ssl` (bounded: `timeout_s` in all, 2 s by default) and names
the cause in one sentence, with the flags that fix it:

    diagnose(address, tls=True, ca_pem=ca, cert_pem=None, key_pem=None)
    -> "the server requires a client certificate (mutual TLS) and none was given: pass --tls-cert and ..."

It answers None when it finds nothing wrong with the transport (the cause is elsewhere: a deadline, a
server that stopped between the call and the probe). It is never on a call's path: callers run it in
their error branch. Standard library only, so that the SDK in `clients/` can use it too.

What the probe sees of a gRPC server under TLS 1.3 (the version grpc negotiates): a server that wants a
client certificate, or rejects the one it got, completes the handshake and then closes the connection
without a TLS alert. The probe therefore sends the HTTP/2 preface after the handshake: a server that
accepted the client answers with its SETTINGS frame, one that refused it closes. Which of "unknown CA" or
"expired" the server saw is not on the wire; the probe checks the client certificate's dates itself.
"""

from __future__ import annotations

import datetime
import enum
import os
import socket
import ssl
import tempfile
import time
from dataclasses import dataclass

DIAGNOSIS_TIMEOUT_S = 2.0
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + empty SETTINGS
# What OpenSSL says when the bytes that came back are not a TLS record (a plaintext HTTP/2 server answers a
# ClientHello with a GOAWAY frame, or closes).
_NOT_TLS_REASONS = ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST")
_REFUSED_CERT_ALERTS = ("CERTIFICATE_REQUIRED", "HANDSHAKE_FAILURE", "UNKNOWN_CA", "BAD_CERTIFICATE")


@dataclass(frozen=True)
class FlagNames:
    """How the caller's user names the settings, for the advice in a diagnosis."""

    ca: str = "--tls-ca"
    cert_and_key: str = "--tls-cert and --tls-key"


CLI_FLAGS = FlagNames()


class Probe(enum.Enum):
    ACCEPTED = "accepted"  # handshake done and the server answered the HTTP/2 preface
    CLOSED_AFTER_HANDSHAKE = "closed"  # handshake done, then the server hung up: it refused the client
    CERT_ALERT = "cert_alert"  # the server refused the client certificate with an alert
    UNTRUSTED = "untrusted"  # the server's certificate did not verify
    NOT_TLS = "not_tls"  # the server does not speak TLS


@dataclass(frozen=True)
class _Outcome:
    probe: Probe
    detail: str = ""


def split_address(address: str) -> tuple[str, int]:
    """host and port of `host:port`, `[v6]:port` or grpc's `ipv4:`/`ipv6:`/`dns:` forms."""
    for scheme in ("ipv4:", "ipv6:", "dns:///", "dns:"):
        if address.startswith(scheme):
            address = address[len(scheme) :]
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _probe(host: str, port: int, context: ssl.SSLContext, deadline: float) -> _Outcome:
    with socket.create_connection((host, port), timeout=_remaining(deadline)) as raw:
        try:
            conn = context.wrap_socket(raw, server_hostname=host)
        except ssl.SSLCertVerificationError as exc:
            return _Outcome(Probe.UNTRUSTED, exc.verify_message or exc.reason or str(exc))
        except ssl.SSLError as exc:
            return _classify(exc, during_handshake=True)
        except (ConnectionResetError, BrokenPipeError):
            return _Outcome(Probe.NOT_TLS, "connection reset during the handshake")
        with conn:
            try:
                conn.settimeout(_remaining(deadline))
                conn.sendall(_H2_PREFACE)
                answer = conn.recv(64)
            except ssl.SSLError as exc:
                return _classify(exc, during_handshake=False)
            except (ConnectionResetError, BrokenPipeError):
                answer = b""
    return _Outcome(Probe.ACCEPTED if answer else Probe.CLOSED_AFTER_HANDSHAKE)


def _classify(exc: ssl.SSLError, *, during_handshake: bool) -> _Outcome:
    reason = exc.reason or str(exc)
    if any(r in reason for r in _REFUSED_CERT_ALERTS) or "EXPIRED" in reason:
        return _Outcome(Probe.CERT_ALERT, reason)
    if not during_handshake:
        return _Outcome(Probe.CLOSED_AFTER_HANDSHAKE, reason)
    if any(r in reason for r in _NOT_TLS_REASONS) or isinstance(exc, ssl.SSLEOFError):
        return _Outcome(Probe.NOT_TLS, reason)
    raise exc


def _context(verify: bool, ca_pem: bytes | None, cert_file: str | None, key_file: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=ca_pem.decode("ascii") if ca_pem else None)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    if cert_file and key_file:
        context.load_cert_chain(cert_file, key_file)
    return context


def _not_after(cert_pem: bytes) -> datetime.datetime | None:
    """The client certificate's expiry, read with the standard library (None when it cannot be read)."""
    with tempfile.NamedTemporaryFile("wb", suffix=".pem") as fh:
        fh.write(cert_pem)
        fh.flush()
        try:
            decoded = ssl._ssl._test_decode_cert(fh.name)  # type: ignore[attr-defined]
        except (ssl.SSLError, AttributeError):
            return None
    return datetime.datetime.fromtimestamp(ssl.cert_time_to_seconds(decoded["notAfter"]), datetime.timezone.utc)


def _refused_client(cert_pem: bytes | None, names: FlagNames, now: datetime.datetime) -> str:
    if cert_pem is None:
        return (
            "the server requires a client certificate (mutual TLS) and none was given: pass "
            f"{names.cert_and_key} (a certificate signed by the CA the server trusts)"
        )
    expiry = _not_after(cert_pem)
    if expiry is not None and expiry < now:
        return f"the server refused the client certificate: it expired on {expiry:%Y-%m-%d %H:%M} UTC"
    return (
        "the server refused the client certificate: it is not signed by a CA the server trusts "
        "(the server's --tls-ca), or it has expired"
    )


def _untrusted(detail: str, ca_given: bool, names: FlagNames) -> str:
    if "mismatch" in detail.lower():
        return f"the server's certificate does not name the address dialed ({detail})"
    if "expired" in detail.lower():
        return f"the server's certificate has expired ({detail})"
    if ca_given:
        return (
            f"the server's certificate is not trusted by the CA you gave ({detail}): {names.ca} must be the "
            "CA that signed it"
        )
    return f"the server's certificate is not trusted by the system roots ({detail}): pass {names.ca}"


def diagnose(
    address: str,
    *,
    tls: bool,
    ca_pem: bytes | None = None,
    cert_pem: bytes | None = None,
    key_pem: bytes | None = None,
    timeout_s: float = DIAGNOSIS_TIMEOUT_S,
    names: FlagNames = CLI_FLAGS,
) -> str | None:
    """One sentence saying why a connection to `address` fails, as the client configured it (`tls`, the
    CA and client certificate it dials with), or None when the transport looks fine."""
    deadline = time.monotonic() + timeout_s
    try:
        host, port = split_address(address)
    except ValueError:
        return None
    try:
        if not tls:
            outcome = _probe(host, port, _context(False, None, None, None), deadline)
            if outcome.probe is Probe.NOT_TLS:
                return None
            return (
                f"the server speaks TLS but this client dialed plaintext: pass {names.ca} (the CA that signed "
                f"the server's certificate) and, under mutual TLS, {names.cert_and_key}"
            )
        with tempfile.TemporaryDirectory() as tmp:
            cert_file = key_file = None
            if cert_pem is not None and key_pem is not None:
                cert_file, key_file = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
                for path, data in ((cert_file, cert_pem), (key_file, key_pem)):
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
                    with os.fdopen(fd, "wb") as fh:
                        fh.write(data)
            outcome = _probe(host, port, _context(True, ca_pem, cert_file, key_file), deadline)
    except ConnectionRefusedError:
        return f"nothing listens on {address} (connection refused)"
    except (TimeoutError, socket.timeout):
        return f"{address} did not complete a TLS handshake within {timeout_s:g} s"
    except (OSError, ssl.SSLError) as exc:
        return f"cannot reach {address}: {getattr(exc, 'strerror', None) or exc}"
    now = datetime.datetime.now(datetime.timezone.utc)
    if outcome.probe is Probe.NOT_TLS:
        return (
            "the server speaks plaintext but this client dialed TLS: start the server with --tls-cert and "
            f"--tls-key, or dial it without {names.ca} and {names.cert_and_key}"
        )
    if outcome.probe is Probe.UNTRUSTED:
        return _untrusted(outcome.detail, ca_pem is not None, names)
    if outcome.probe in (Probe.CLOSED_AFTER_HANDSHAKE, Probe.CERT_ALERT):
        return _refused_client(cert_pem if key_pem is not None else None, names, now)
    return None
