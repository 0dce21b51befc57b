"""Every ``BRIDGE_*`` variable is read in ``bridge/config/settings.py`` only, so each setting (the
resource sources and the CUDA library included) has its flag, env and file forms."""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

from bridge.config import settings as settings_mod
from bridge.decimate import cuda
from bridge.resources.cgroup import open_cgroup

ROOT = Path(__file__).resolve().parents[2]
MOVING_OUT = {"bridge/decimate/bench.py"}  # a benchmark, leaving the runtime package

SOURCES = {
    "cgroup_root": "/sys/fs/cgroup/x",
    "kube_api": "http://127.0.0.1:1",
    "kube_token_file": "/t",
    "pod_name": "p",
    "pod_namespace": "ns",
    "container_name": "c",
    "cuda_lib": "/lib/x.so",
}


def test_no_module_but_settings_names_a_bridge_variable() -> None:
    offenders = []
    for path in sorted((ROOT / "bridge").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "bridge/config/settings.py" or rel in MOVING_OUT or rel.startswith("bridge/v1/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            value = node.value if isinstance(node, ast.Constant) else None
            if isinstance(value, str) and value.startswith("BRIDGE_") and value.isupper():
                offenders.append(f"{rel}:{node.lineno} {value}")
    assert offenders == []


def test_resource_sources_have_flag_env_and_file_forms(tmp_path: Path) -> None:
    env = {settings_mod.env_name(k): v for k, v in SOURCES.items()}
    from_env = settings_mod.load(env=env)
    config = tmp_path / "bridge.json"
    config.write_text(json.dumps(SOURCES))
    from_file = settings_mod.load(env={}, config_file=config)
    parser = argparse.ArgumentParser()
    settings_mod.add_arguments(parser)
    argv = [x for k, v in SOURCES.items() for x in ("--" + k.replace("_", "-"), v)]
    from_flags = settings_mod.from_args(parser.parse_args(argv), env={})
    for name, value in SOURCES.items():
        assert getattr(from_env, name) == getattr(from_file, name) == value
        assert getattr(from_flags, name) == value


def test_cgroup_root_and_cuda_library_come_from_the_arguments(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("200000 100000\n")
    assert open_cgroup(str(tmp_path)).read().cpu_max is not None
    try:
        cuda.use_library(str(tmp_path / "nope.so"))
        assert cuda.library_path() == tmp_path / "nope.so"
        assert "nope.so missing" in (cuda.unavailable_reason() or "")
    finally:
        cuda.use_library("")
        assert cuda.library_path().name == "_sbv_cuda.so"
