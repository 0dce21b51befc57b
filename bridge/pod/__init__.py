"""The pod: a supervisor running several ingest processes behind the same ports (docs/scaling.md)."""
