"""The real-container rig: podman + runc, live resizes, hostile edges (``make e2e-container``)."""
