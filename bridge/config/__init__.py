"""The bridge's settings: flags, environment and file, validated once at start; credentials and
PEM files checked before anything listens. Imports only ``bridge.protocol`` (its errors)."""
