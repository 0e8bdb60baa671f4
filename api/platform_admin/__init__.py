"""The platform administrators' APIs over every workspace (batches, files, jobs) and their audit
events."""
