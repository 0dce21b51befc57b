"""Load generator, reference visualization sink and resize drivers for simbridge."""
