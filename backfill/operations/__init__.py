"""Operating a deployment: `backfill doctor` and the running `backfill dev`'s state file."""
