"""Benchmarks, run on demand (never part of CI's pass/fail). See bench/README.md."""
