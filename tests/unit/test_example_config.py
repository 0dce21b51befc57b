"""The example ``--config`` file loads as written, and every value in it reaches the settings."""

from __future__ import annotations

from pathlib import Path

import yaml

from bridge.config import settings as settings_mod

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "simbridge.yaml"


def test_example_config_loads_and_every_key_is_applied() -> None:
    written = yaml.safe_load(EXAMPLE.read_text())
    assert isinstance(written, dict) and len(written) >= 10
    loaded = settings_mod.load(env={}, config_file=EXAMPLE)  # unknown keys would raise
    for key, value in written.items():
        assert getattr(loaded, key) == value, key
    # Not a copy of the defaults: it shows how to change something.
    defaults = settings_mod.Settings()
    assert any(getattr(defaults, key) != value for key, value in written.items())
