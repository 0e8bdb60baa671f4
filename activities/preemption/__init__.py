"""Preemptive yield on a worker: which running lines give their seat back, and the send that gives
it."""
