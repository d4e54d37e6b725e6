"""`trainctl ls`: every run, here, on the hosts in hosts.toml and in Slurm
(src/trainctl/hosts/all_runs.py gathers the rows)."""

from __future__ import annotations

import json


def cmd_ls(args) -> int:
    """Every run: this machine's (run directories, Slurm jobs), then each host's in
    <config>/hosts.toml (``hosts = ["gpu-box", ...]``) over ssh (`trainctl ls --here --json`
    there).  A host that cannot be reached is a row saying why."""
    from trainctl.hosts.all_runs import all_rows

    rows = all_rows(here=args.here)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(_ls_table(rows))
    return 0


def _ls_table(rows: list[dict]) -> str:
    from trainctl.store.listing import COLUMNS, row_cells

    lines = [COLUMNS, *(row_cells(r) for r in rows)]
    widths = [max(len(ln[i]) for ln in lines) for i in range(len(COLUMNS) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(ln, widths)) + "  " + ln[-1] for ln in lines)
