"""The usage journal: one entry per upstream attempt, and its hourly totals."""
