"""PEM files checked when settings load, with the ``ssl`` module, one line per bad file.

Why: gRPC reports a bad certificate, key or CA only as C-level log lines followed by "Failed to
bind", which reads as a port problem; the sink's CA is not read until the first connection, which
then fails forever while the bridge says it is ready. OpenSSL parses the same PEM that gRPC does,
so a file ``ssl`` accepts here is one gRPC accepts at startup.
"""

from __future__ import annotations

import ssl


def _no_password() -> bytes:
    """An encrypted key is refused here rather than prompting on a terminal (gRPC has no
    password either)."""
    raise ValueError("the private key is encrypted (simbridge needs an unencrypted key)")


def _why(exc: ssl.SSLError) -> str:
    reason = (exc.reason or "").upper()
    if reason == "NO_CERTIFICATE_OR_CRL_FOUND":
        return "no PEM certificate in it"
    if reason == "KEY_VALUES_MISMATCH":
        return "does not match the certificate"
    return str(exc)


def ca_problem(name: str, path: str) -> str | None:
    """``name: path: why`` when ``path`` holds no usable PEM CA certificate, else None."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        ctx.load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        return f"{name}: {path}: {_why(exc)}"
    except OSError as exc:
        return f"{name}: {path}: {exc.strerror or exc}"
    return None


def pair_problems(cert_name: str, cert: str, key_name: str, key: str) -> list[str]:
    """One line for the certificate chain or, when it is fine, for its private key: not PEM,
    encrypted, or not the key of that certificate."""
    problem = ca_problem(cert_name, cert)  # the chain must at least parse as certificates
    if problem is not None:
        return [problem]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert, key, password=_no_password)
    except ValueError as exc:
        return [f"{key_name}: {key}: {exc}"]
    except ssl.SSLError as exc:
        if (exc.reason or "").upper() == "KEY_VALUES_MISMATCH":
            return [f"{key_name}: {key}: not the private key of the certificate in {cert}"]
        if "PEM" in str(exc).upper():  # OpenSSL's "[SSL] PEM lib": no key block in the file
            return [f"{key_name}: {key}: not a PEM private key"]
        return [f"{key_name}: {key}: {_why(exc)}"]
    except OSError as exc:
        return [f"{key_name}: {key}: {exc.strerror or exc}"]
    return []
