"""The pod: a supervisor running several ingest processes behind one port pair (docs/scaling.md)."""
