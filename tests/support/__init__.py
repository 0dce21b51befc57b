"""Helpers the tests share: stubs, synthetic inputs (never imported by the product)."""
