"""The management API of a route (settings and live status) and the api's one reader of each route
scheduler."""
