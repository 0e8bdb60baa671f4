"""The worker's ends of preemptive yield's channel: `POST /preempt/live`, and its batch lines sent
to its peers."""
