"""The api's side of preemptive yield: live counts sent straight to the workers."""
