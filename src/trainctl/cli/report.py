"""`trainctl report RUN_DIR`: the run's report (src/trainctl/report/) as one self-contained
HTML file, or Markdown with ``--md``; its path printed.  A run on a box (``ssh://HOST/PATH``)
is reported there (its `trainctl report --stdout`) and the file written here."""

from __future__ import annotations

import sys
from pathlib import Path

from trainctl.cli.common import UsageError


def cmd_report(args) -> int:
    from trainctl.hosts.registry import locate

    host, run_dir = locate(args.run_dir)
    suffix = "md" if args.md else "html"
    link = getattr(host, "link", None)  # a box over ssh: the report is made where the journal is
    if link is not None:
        text = _remote(link, run_dir, args.md)
        default = Path.cwd() / f"{Path(run_dir).name}-report.{suffix}"
    else:
        text = render(run_dir, args.md)
        default = Path(run_dir) / f"report.{suffix}"
    if args.stdout:
        sys.stdout.write(text)
        return 0
    out = Path(args.output) if args.output else default
    try:
        _write(out, text)
    except OSError as e:
        if args.output or link is not None:
            raise UsageError(f"cannot write {out}: {e.strerror or e}") from None
        out = Path.cwd() / f"{Path(run_dir).name}-report.{suffix}"  # the run directory is not ours
        _write(out, text)
    print(out)
    return 0


def render(run_dir: str, md: bool) -> str:
    from trainctl.report.collect import collect
    from trainctl.report.render import html_report, markdown_report

    try:
        report = collect(run_dir)
    except OSError as e:
        raise UsageError(str(e)) from None
    return markdown_report(report) if md else html_report(report)


def _remote(link, run_dir: str, md: bool) -> str:
    from trainctl.hosts.ssh import RemoteError

    argv = [*link.remote_trainctl, "report", run_dir, "--stdout", *(["--md"] if md else [])]
    try:
        r = link.run(argv, timeout=300)
    except RemoteError as e:
        raise UsageError(str(e)) from None
    if r.returncode != 0:
        raise UsageError(f"trainctl report on {link.name}: {(r.stderr or r.stdout).strip()[:400]}")
    return r.stdout


def _write(path: Path, text: str) -> None:
    """Atomically: a reader never sees half a report."""
    from trainctl.core.statefile import write_atomic

    write_atomic(path, text, mode=None)  # a temporary file of a random name: never a planted link
