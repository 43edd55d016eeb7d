"""``edge-agent run``: the daemon."""
