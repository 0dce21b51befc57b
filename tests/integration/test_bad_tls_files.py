"""Bad TLS files and busy ports, as ``simbridge serve`` reports them (issue 33).

Before: a key that is not the certificate's, a non-PEM certificate or a bad client CA came out as
gRPC's C-level ``E...`` lines and "cannot listen on 127.0.0.1:0 (gRPC)"; a bad sink CA started
the bridge, which then retried the sink forever. Each must now exit 2 with one line that names
the setting, the file and the problem, and nothing from gRPC's own logger.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.harness import ROOT

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not found")

LISTEN = ("--host", "127.0.0.1", "--ws-port", "0", "--grpc-port", "0", "--http-port", "0")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tlsfiles")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out",
             "tls.crt", "-days", "1", "-subj", "/CN=localhost", cwd=d)  # fmt: skip
    _openssl("genrsa", "-out", "other.key", "2048", cwd=d)
    _openssl("rsa", "-in", "tls.key", "-aes256", "-passout", "pass:x", "-out", "enc.key", cwd=d)
    _openssl("x509", "-in", "tls.crt", "-outform", "DER", "-out", "tls.der", cwd=d)
    (d / "notes.txt").write_text("not a certificate\n")
    return d


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BRIDGE_", "GRPC_"))}
    return subprocess.run(
        [sys.executable, "-m", "bridge.cli", "serve", "--no-adapt", *LISTEN, *args],
        capture_output=True,
        text=True,
        timeout=60,  # a bridge that starts despite the bad file would run until this
        cwd=ROOT,
        env=env,
    )


def _one_problem(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "SIMBRIDGE_READY" not in proc.stdout
    lines = proc.stderr.splitlines()
    assert not [ln for ln in lines if ln.startswith(("E1", "E0", "W1", "W0"))], proc.stderr
    assert "cannot listen" not in proc.stderr, proc.stderr
    problems = [ln.strip() for ln in lines if not ln.startswith("simbridge: invalid")]
    assert len(problems) == 1, proc.stderr
    return problems[0]


@pytest.mark.parametrize(
    ("cert", "key", "setting", "bad", "why"),
    [
        ("tls.crt", "other.key", "tls_key_file", "other.key", "not the private key of"),
        ("tls.der", "tls.key", "tls_cert_file", "tls.der", "no PEM certificate"),
        ("notes.txt", "tls.key", "tls_cert_file", "notes.txt", "no PEM certificate"),
        ("tls.crt", "notes.txt", "tls_key_file", "notes.txt", "not a PEM private key"),
        ("tls.crt", "enc.key", "tls_key_file", "enc.key", "encrypted"),
    ],
)
def test_a_bad_server_pair_names_the_file_and_the_problem(
    files: Path, cert: str, key: str, setting: str, bad: str, why: str
) -> None:
    proc = _serve("--tls-cert-file", str(files / cert), "--tls-key-file", str(files / key))
    line = _one_problem(proc)
    assert line.startswith(f"{setting}: {files / bad}:") and why in line, line


def test_a_bad_client_ca_names_the_file(files: Path) -> None:
    pair = ("--tls-cert-file", str(files / "tls.crt"), "--tls-key-file", str(files / "tls.key"))
    proc = _serve(*pair, "--tls-client-ca-file", str(files / "notes.txt"))
    line = _one_problem(proc)
    assert line.startswith(f"tls_client_ca_file: {files / 'notes.txt'}:"), line


def test_a_bad_sink_ca_is_refused_before_ready(files: Path) -> None:
    proc = _serve("--sink-address", "127.0.0.1:1", "--sink-ca-file", str(files / "tls.key"))
    line = _one_problem(proc)
    assert line.startswith(f"sink_ca_file: {files / 'tls.key'}:"), line


def test_a_good_pair_still_starts(files: Path) -> None:
    """The check refuses only what gRPC would: the real pair passes settings validation."""
    from bridge.config import settings as settings_mod

    pair = {"tls_cert_file": str(files / "tls.crt"), "tls_key_file": str(files / "tls.key")}
    loaded = settings_mod.load(pair, env={})
    assert loaded.tls_cert_file == pair["tls_cert_file"]


def test_a_busy_port_is_one_line_with_the_cause() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = _serve("--grpc-port", str(port))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    want = f"simbridge: cannot listen on 127.0.0.1:{port} (gRPC): Address already in use"
    assert proc.stderr.strip() == want, proc.stderr
