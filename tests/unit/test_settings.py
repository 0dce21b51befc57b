"""Settings precedence (flags > env > file > defaults) and all-at-once validation."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bridge.config import settings
from bridge.protocol.errors import ConfigError


def test_precedence_flags_over_env_over_file_over_defaults(tmp_path: Path) -> None:
    cfg = tmp_path / "bridge.yaml"
    cfg.write_text("ws_port: 1111\ngrpc_port: 2222\nhttp_port: 3333\nvoxel_size: 0.2\n")
    env = {"BRIDGE_GRPC_PORT": "4444", "BRIDGE_HTTP_PORT": "5555"}
    s = settings.load({"http_port": "6666"}, env, cfg)
    assert (s.ws_port, s.grpc_port, s.http_port, s.voxel_size) == (1111, 4444, 6666, 0.2)
    assert s.max_frame_bytes == settings.Settings().max_frame_bytes


def test_toml_and_env_config_path(tmp_path: Path) -> None:
    cfg = tmp_path / "bridge.toml"
    cfg.write_text('overflow_policy = "drop_oldest"\npassthrough = true\n')
    s = settings.load({}, {"BRIDGE_CONFIG": str(cfg)})
    assert s.overflow_policy == "drop_oldest" and s.passthrough is True


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("no_such_setting: 1\n")
    with pytest.raises(ConfigError) as info:
        settings.load(
            {"ws_port": "x", "overflow_policy": "sometimes"},
            {"BRIDGE_MAX_FRAME_BYTES": "0", "BRIDGE_PASSTHROUGH": "maybe"},
            cfg,
        )
    text = "\n".join(info.value.problems)
    for fragment in (
        "no_such_setting",
        "ws_port",
        "overflow_policy",
        "max_frame_bytes",
        "passthrough",
    ):
        assert fragment in text
    assert len(info.value.problems) == 5


def test_flags_from_argparse() -> None:
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    ns = parser.parse_args(["--ws-port", "0", "--no-adapt", "--decimate-backend", "numpy"])
    s = settings.from_args(ns, env={})
    assert s.ws_port == 0 and s.adapt is False and s.decimate_backend == "numpy"


def test_secrets_are_masked() -> None:
    s = settings.Settings(auth_token="hunter2")
    assert s.public_dict()["auth_token"] == "***"


@pytest.mark.parametrize("window", [0, 16383, 64 * 1024 * 1024 + 1])
def test_grpc_window_outside_what_http2_and_the_budget_allow_is_refused(window: int) -> None:
    with pytest.raises(ConfigError) as info:
        settings.load({"grpc_window_bytes": str(window)}, {}, None)
    assert any("grpc_window_bytes" in p for p in info.value.problems)
