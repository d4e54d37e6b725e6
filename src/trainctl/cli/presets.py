"""`trainctl presets list|show|validate|edit`: the presets, and $EDITOR on one."""

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
