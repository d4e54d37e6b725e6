"""`trainctl status [RUN_DIR]`: the state and projection of a run, as the status builder
(src/trainctl/hosts/run_status.py) assembles it for the run's host; exit 4 (after the run directory's) when
the agent is there but does not answer."""

from __future__ import annotations

import contextlib
import json
import sys
import time


def cmd_status(args) -> int:
    """The agent's status, else the run directory's; exit 4 (after the run directory's)
    when the agent is there but does not answer."""
    from trainctl.core import events as E
    from trainctl.core.recovery import FINAL_STATES
    from trainctl.hosts.registry import locate
    from trainctl.hosts.run_status import run_status

    host, run_dir = locate(args.run_dir)
    built = run_status(run_dir, host)
    if built.error is not None:
        print(f"trainctl: {built.error}", file=sys.stderr)
    status, code, agent = built.status, built.code, built.agent
    if args.json:
        print(json.dumps(status, indent=2))
        return code
    from trainctl.core.projection_text import format_projection

    print(f"run     {status.get('run_dir', run_dir)} ({agent})")
    workers = status.get("workers")  # counted in the trainer's tree: what is in effect
    seen = "" if workers is None else f" ({workers} DataLoader worker{'' if workers == 1 else 's'} seen)"
    print(
        f"state   {status.get('state', '?')}   preset {status.get('preset') or '-'}{seen}"
        f"   attempt {status.get('attempt', '?')}"
    )
    if status.get("slurm"):
        sl = status["slurm"]
        reason = f" ({sl['reason']})" if sl.get("reason") not in (None, "", "None") else ""
        print(
            f"slurm   job {sl['job']} {sl.get('state', sl.get('error', '?'))}{reason}"
            f"   jobs {', '.join(sl['jobs'])}"
        )
    proj = status.get("projection")
    if proj and status.get("state") in FINAL_STATES and not proj.get("finished"):
        print(f"        no ETA: the run is {status['state']}")  # its last live one is stale
    elif proj:
        projection = E.from_dict(proj)
        assert isinstance(projection, E.Projection)  # run_status puts a Projection's to_dict there
        for line in format_projection(projection, time.time(), status.get("currency", "$")):
            print(f"        {line}")
    else:
        print("        no projection yet")
    if status.get("goodput"):
        from trainctl.core.goodput import describe

        print(f"        {describe(status['goodput'])}")
    if isinstance(status.get("resumed"), dict):  # the last restart: from which checkpoint
        from trainctl.core.resumed import resumed_phrase

        print(f"restart {status['resumed'].get('attempt', '?')}: {resumed_phrase(status['resumed'])}")
    if status.get("save_dir"):  # Ultralytics' save_dir: the weights, plots and results.csv
        print(f"results {status['save_dir']}")
    if status.get("progress"):
        from trainctl.agent.scan import describe_position

        with contextlib.suppress(ValueError, TypeError, KeyError):  # an older agent's reply
            print(f"at      {describe_position(E.from_dict(status['progress']))}")
    if status.get("ranks"):
        print("ranks   " + _rank_rows(status["ranks"]))
    if isinstance(status.get("gpus"), dict):
        from trainctl.core.gpu_text import gpu_row

        gpus = status["gpus"]
        for device in gpus.get("devices") or ():
            print(f"gpu {device.get('index', '?'):<3} {gpu_row(device)}")
        print(f"        the run's GPUs by {gpus.get('rule', '?')}: {gpus.get('why', '?')}")
    if unreadable := status.get("unreadable"):
        print(f"journal {unreadable} unreadable line{'s' if unreadable != 1 else ''} skipped")
    for node in status.get("nodes", ()):
        print(
            f"node {node['node']}  {node.get('state') or '?'}   attempt {node.get('attempt') or '?'}"
            f"   {'agent live' if node['live'] else 'agent not running'}   {node['run_dir']}"
        )
    return code


def _rank_rows(ranks: dict) -> str:
    return " · ".join(
        f"{r}: epoch {v.get('epoch')} batch {v.get('batch')}/{v.get('batches') or '?'}"
        + (" STUCK" if v.get("stuck") else "")
        for r, v in ranks.items()
    )
