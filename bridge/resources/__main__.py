"""``python -m bridge.resources`` = ``simbridge resources``."""

from bridge.resources.cli import main

raise SystemExit(main())
