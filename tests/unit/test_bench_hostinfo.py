"""The CPU line of the benchmark headers: model name plus family and model, which tell apart
host generations that share a model name."""

from __future__ import annotations

from benchmarks.hostinfo import cpu_description

# The shape of /proc/cpuinfo on this project's VMs (two processors; fields trimmed).
ZEN5 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
stepping\t: 1

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
"""


def test_model_name_with_family_and_model() -> None:
    assert cpu_description(ZEN5) == "AMD EPYC (family 26, model 2)"


def test_two_generations_with_one_model_name_read_differently() -> None:
    zen4 = ZEN5.replace("cpu family\t: 26", "cpu family\t: 25").replace(
        "model\t\t: 2", "model\t\t: 17"
    )
    assert cpu_description(zen4) == "AMD EPYC (family 25, model 17)"
    assert cpu_description(zen4) != cpu_description(ZEN5)


def test_only_the_first_processor_is_read() -> None:
    first, _, second = ZEN5.partition("\n\n")
    mixed = first + "\n\n" + second.replace("AMD EPYC", "Other")
    assert cpu_description(mixed) == "AMD EPYC (family 26, model 2)"


def test_without_cpuinfo_fields_it_still_names_something() -> None:
    assert cpu_description("") != ""
    assert cpu_description("model name : Some ARM core\n") == "Some ARM core"


def test_this_machine() -> None:
    assert cpu_description().strip()
