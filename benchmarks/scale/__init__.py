"""``make bench-scale``: aggregate throughput at N processes, with the generator's share named."""
