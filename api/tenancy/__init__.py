"""The api's side of per-workspace admission (decision 0020)."""
