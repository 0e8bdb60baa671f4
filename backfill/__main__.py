"""`python -m backfill ...`: the same as the `backfill` console script."""

from backfill.cli import main

raise SystemExit(main())
