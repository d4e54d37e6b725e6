"""`trainctl scan LOG`: the postmortem of a saved training log (src/trainctl/agent/scan.py)."""

from __future__ import annotations


def cmd_scan(args) -> int:
    from trainctl.agent.scan import main_scan
    from trainctl.agent.scan_explain import main_explain

    if args.explain or args.job:
        return main_explain(args.logfile, args.json, args.job)
    return main_scan(args.logfile, args.json, args.kernel_log)
