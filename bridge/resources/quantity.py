"""Kubernetes resource quantities (``"2"``, ``"250m"``, ``"12Gi"``, ``"1e3"``) as exact numbers.

Why a module of its own: the Pod, ResourceClaim and ResourceSlice models and the local API
stand-in all compare quantities, and a float round trip would make ``"12Gi"`` and ``12884901888``
differ. Parsing returns a :class:`fractions.Fraction`; callers convert with :func:`to_bytes`
(memory, rounded up like the API server's ``Value()``) or :func:`to_millicores` (cpu, rounded up
like ``MilliValue()``).

Grammar (apimachinery ``resource.Quantity``): ``[+-]<digits>[.<digits>]<suffix>``, the suffix
binary SI (``Ki Mi Gi Ti Pi Ei``), decimal SI (``n u m "" k M G T P E``) or a decimal exponent
(``e3``/``E-2``). Anything else is a :class:`QuantityError` (a ``ValueError``).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_RE = re.compile(r"^([+-]?)(\d+\.?\d*|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?\d+|[numkMGTPE]?)$")


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity."""


def parse_quantity(text: str | int | float) -> Fraction:
    """Parse a quantity exactly; ints/floats (as found in some JSON) are plain numbers."""
    if isinstance(text, bool):
        raise QuantityError(f"not a quantity: {text!r}")
    if isinstance(text, int):
        return Fraction(text)
    if isinstance(text, float):
        if not math.isfinite(text):
            raise QuantityError(f"not a quantity: {text!r}")
        return Fraction(text)
    m = _RE.match(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise QuantityError(f"not a quantity: {text!r}")
    sign, number, suffix = m.groups()
    value = Fraction(number)
    if suffix in _BINARY:
        value *= 1024 ** _BINARY[suffix]
    elif suffix[:1] in ("e", "E"):
        value *= Fraction(10) ** int(suffix[1:])
    else:
        value *= Fraction(10) ** _DECIMAL[suffix]
    return -value if sign == "-" else value


def to_bytes(text: str | int | float) -> int:
    """A memory-like quantity as whole units, rounded up (``"1.5Ki"`` → 1536, ``"100m"`` → 1)."""
    return math.ceil(parse_quantity(text))


def to_millicores(text: str | int | float) -> int:
    """A cpu quantity in millicores, rounded up (``"250m"`` → 250, ``"2"`` → 2000, ``"1u"`` → 1)."""
    return math.ceil(parse_quantity(text) * 1000)


def format_bytes(n: int | None) -> str:
    """Human form for logs and ``simbridge resources``: ``8.0 GiB``; ``None`` means unlimited."""
    if n is None:
        return "unlimited"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
