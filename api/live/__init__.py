"""The live proxy: forwarding, its relay, per-workspace limits, token counts, live traffic per route
and its reporter to the schedulers."""
