"""The model servers behind the routes: the endpoint registry, the one way a request to them is
built, what a body may carry upstream, and reading their load from `/metrics`."""
