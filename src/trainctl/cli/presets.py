"""`trainctl presets list|show|validate|edit|stats`: the presets, $EDITOR on one, and
what the preset history says of them."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from trainctl.cli.common import UsageError, note


def cmd_presets(args) -> int:
    """list (a table: a broken preset is a row saying so), show, validate (every preset when
    none is named), edit (a shipped preset: a copy in the user's config directory)."""
    from trainctl.config import ConfigError, list_presets, load_preset

    if args.action == "list":
        print(_presets_table(list_presets()))
        return 0
    if args.action == "stats":
        if len(args.names) > 1:
            raise UsageError("presets stats takes at most one job name")
        return cmd_presets_stats(args.names[0] if args.names else None, args.json)
    if not args.names and args.action != "validate":
        raise UsageError(f"presets {args.action} needs a preset name or path")
    status = 0
    for ref in args.names or [str(p) for p in list_presets()]:
        try:
            p = load_preset(ref)
        except ConfigError as e:
            print(f"trainctl: {e}", file=sys.stderr)
            status = 2
            continue
        if args.action == "show":
            print(f"# {p.path}")
            print(Path(p.path).read_text() if p.path else p)
        elif args.action == "validate":
            print(f"{p.path}: ok")
        elif args.action == "edit":
            status = max(status, _edit_preset(p))
    return status


def _presets_table(paths: list[Path]) -> str:
    """NAME, FILE, WHAT: one line each; an invalid preset's line says so and how to see why."""
    from trainctl.config import ConfigError, load_preset
    from trainctl.core.sanitize import sanitize_text

    rows = [("NAME", "FILE", "WHAT")]
    for path in paths:
        try:
            what = load_preset(path).description or "-"
        except ConfigError as e:
            problems = str(e).count("\n") + 1
            what = (
                f"INVALID ({problems} problem{'s' if problems > 1 else ''}: "
                f"trainctl presets validate {shlex.quote(str(path))})"
            )
        rows.append((path.stem, str(path), " ".join(sanitize_text(what).split())))
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    return "\n".join(f"{r[0].ljust(widths[0])}  {r[1].ljust(widths[1])}  {r[2]}" for r in rows)


def _edit_preset(p) -> int:
    """$EDITOR on the preset, again while it does not validate.  A preset shipped with
    trainctl is never changed: the user's copy in <config dir>/presets is edited (made from
    it when missing), and shadows it wherever the name is looked up."""
    from trainctl.config import ConfigError, is_shipped, load_preset, user_config_dir

    path = Path(p.path)
    if is_shipped(path):
        copy = user_config_dir() / "presets" / path.name
        if not copy.exists():
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, copy)
            note(
                f"{path.name} is shipped with trainctl: editing your copy {copy} "
                "(it takes the place of the shipped one)"
            )
        else:
            note(f"{path.name} is shipped with trainctl: editing your copy {copy}")
        path = copy
    editor = _editor_argv()
    while True:
        try:
            subprocess.call([*editor, str(path)])
        except OSError as e:
            raise UsageError(
                f"cannot start the editor {editor[0]!r} ($VISUAL/$EDITOR "
                f"= {shlex.join(editor)!r}): {e.strerror or e}"
            ) from None
        try:
            load_preset(path)
            print(f"{path}: ok")
            return 0
        except ConfigError as e:
            print(f"trainctl: {e}", file=sys.stderr)
            if input("edit again? [Y/n] ").strip().lower() == "n":
                return 2


def _editor_argv() -> list[str]:
    """$VISUAL, else $EDITOR, else vi, split as a shell would (`code --wait`)."""
    value = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    try:
        argv = shlex.split(value)
    except ValueError as e:
        raise UsageError(f"$VISUAL/$EDITOR = {value!r}: cannot split it ({e})") from None
    if not argv:
        raise UsageError("$VISUAL/$EDITOR is blank: set it to an editor command")
    return argv


def cmd_presets_stats(job: str | None, as_json: bool) -> int:
    """`trainctl presets stats [JOB]`: what the preset history holds, per job and machine,
    each preset with its incidents and the estimate of its rate (src/trainctl/core/preset_risk.py)."""
    import json

    from trainctl.store.preset_history import PresetHistory

    history = PresetHistory()
    records, problems = history.read(job)
    for text in problems:
        note(text)
    if as_json:
        print(json.dumps([_stats_json(r) for r in records], indent=1))
        return 0
    if not records:
        what = f"for job {job!r} " if job else ""
        print(f"no preset history {what}yet ({history.dir}): every run records its presets as it goes")
        return 0
    print("\n\n".join(_stats_tables(records)))
    return 0


def _current_contents() -> dict[str, str]:
    """Preset name -> the content hash of the preset by that name now (to mark older records)."""
    from trainctl.config import ConfigError, list_presets, load_preset
    from trainctl.store.preset_history import preset_content

    out = {}
    for path in list_presets():
        try:
            out[path.stem] = preset_content(load_preset(path))
        except ConfigError:
            continue
    return out


def _stats_tables(records) -> list[str]:
    from trainctl.core.projection_text import hours_phrase, humanize_duration

    current = _current_contents()
    groups: dict[tuple[str, str], list] = {}
    for r in records:
        groups.setdefault((r.key.job, r.key.machine), []).append(r)
    tables = []
    for (job, machine), rows in groups.items():
        table = [("PRESET", "RUNS", "HOURS", "BATCHES", "INCIDENTS", "EACH", "PER HOUR (90 %)", "ONE IN")]
        for r in rows:
            risk = r.risk()
            name = r.key.preset or "(none)"
            if r.key.preset in current and current[r.key.preset] != r.key.content:
                name += " (an earlier version)"
            kinds = ", ".join(f"{n} {k}" for k, n in sorted(r.incidents.items()) if n)
            each = "-" if not r.incident_count else "≈ " + humanize_duration(risk.mean_cost_s)
            if r.incident_count and not risk.cost_measured:
                each += " (default)"
            table.append(
                (
                    name,
                    str(r.runs),
                    hours_phrase(r.hours),
                    f"{r.batches:,}",
                    f"{r.incident_count}" + (f" ({kinds})" if kinds else ""),
                    each,
                    f"{_rate(risk.rate_per_h)} ({_rate(risk.rate_low_per_h)}–{_rate(risk.rate_high_per_h)})",
                    hours_phrase(risk.mean_time_between_h),
                )
            )
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table]
        tables.append(f"job {job} on {machine}\n" + "\n".join(lines))
    return tables


def _rate(x: float) -> str:
    """Incidents per hour, two significant figures, never in e-notation."""
    return "<0.001" if x < 0.001 else f"{x:.2g}" if x >= 0.01 else f"{x:.3f}"


def _stats_json(r) -> dict:
    risk = r.risk()
    return {
        **r.as_dict(),
        "runs": r.runs,
        "rate_per_h": risk.rate_per_h,
        "rate_low_per_h": risk.rate_low_per_h,
        "rate_high_per_h": risk.rate_high_per_h,
        "mean_cost_s": risk.mean_cost_s,
        "cost_measured": risk.cost_measured,
    }
