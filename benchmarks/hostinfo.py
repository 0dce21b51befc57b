"""Which CPU a benchmark ran on, for its header and JSON.

Why: figures from this project's 2-core VMs moved 2-3x between host generations (the same code,
the same "AMD EPYC" model name), so a result is only comparable with others from the same
kind of CPU. The kernel's model name alone does not tell them apart; family and model do.
"""

from __future__ import annotations

import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def cpu_description(cpuinfo: str | None = None) -> str:
    """``"<model name> (family F, model M)"`` of the first CPU in ``cpuinfo`` (the text of
    /proc/cpuinfo; read here when not given), or what ``platform`` knows where there is none."""
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough: a VM's CPUs are alike
            continue
        name, sep, value = line.partition(":")
        if sep:
            fields.setdefault(name.strip(), value.strip())
    model_name = fields.get("model name") or platform.processor() or platform.machine() or "?"
    family, model = fields.get("cpu family"), fields.get("model")
    if family and model:
        return f"{model_name} (family {family}, model {model})"
    return model_name
