"""``make bench-relay``: edges → bridge → sink at full speed, CPU per message side by side."""
