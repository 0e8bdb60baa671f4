"""`python -m tools ...`: the same as the `backfill` console script."""

from tools.cli import main

raise SystemExit(main())
