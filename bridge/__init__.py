"""simbridge: a live simulation bridge data plane."""
