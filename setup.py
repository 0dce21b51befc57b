"""Build hook for the optional native decimation extension (see native/README.md).

BRIDGE_BUILD_NATIVE=auto|yes|no (default auto): auto builds the C extension when a compiler
works and quietly skips it otherwise; yes makes a build failure fatal; no skips it.
"""

from setuptools import setup

setup()
