"""`GET /api/v1/admin/usage`: hourly usage totals from the usage journal."""
