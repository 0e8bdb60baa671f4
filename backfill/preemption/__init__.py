"""Preemptive yield (decision 0023): a route's policy as its scheduler holds it (its gate entry
stays in the route's gate registry, `backfill.routes.gates.preempt`), the channel's peers, its
signed reports and the reports that did not arrive."""
