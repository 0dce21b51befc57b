"""Benchmarks for humans (``make bench-*``); not run by the test suite."""
