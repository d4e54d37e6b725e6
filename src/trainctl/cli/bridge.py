"""`trainctl bridge RUN_DIR` (hidden): what `ssh HOST trainctl bridge DIR` runs, the relay of
src/trainctl/client/relay.py."""

from __future__ import annotations


def cmd_bridge(args) -> int:
    """Relay stdin/stdout to the agent's socket (src/trainctl/client/relay.py): exit 4 when
    the agent's hello does not come in time, 2 for a run directory not the user's own."""
    from trainctl.client.relay import relay

    return relay(args.run_dir)
