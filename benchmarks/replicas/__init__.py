"""``make e2e-replicas``: several bridges behind HAProxy, devices moved without loss."""
