"""The one writer of the tables in docs/benchmarks.md: a bench hands it a table (its rows; the
header is the bench's own ``DOC_TABLES`` entry) and it prints it, and with ``--docs`` writes it
between ``<!-- bench:NAME begin -->`` and ``<!-- bench:NAME end -->`` in docs/benchmarks.md,
under a provenance line: the date, the commit, the machine (cores, CPU model), /proc/loadavg
at the bench's start and at the table's end, and the command that made it.

    rec = Recorder(DOC_TABLES)         # at the bench's start: the date and load then
    rec.publish("certain-stall", rows)  # rows: lists of cells, as many as the header's

``parse_blocks`` reads the blocks back (tests/unit/test_bench_docs.py: each block parses as
its script writes it; a table edited by hand into another shape fails there).  ``DOC_TABLES``
is a literal in each bench (``{"name": ("column", ...)}``) so that the test reads it with ast,
not by importing the bench.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- bench:{} begin -->"
END = "<!-- bench:{} end -->"
BLOCK = re.compile(r"<!-- bench:([a-z0-9-]+) begin -->\n(.*?)\n<!-- bench:\1 end -->", re.S)
PROVENANCE = re.compile(
    r"^Ran (?P<start>\d{4}-\d\d-\d\d \d\d:\d\d) → (?P<end>\d{4}-\d\d-\d\d \d\d:\d\d) UTC, "
    r"commit (?P<commit>\S+(?: \(\+ uncommitted changes\))?), (?P<machine>\d+ cores \([^)]*\)), "
    r"load average (?P<load0>[0-9. /]+) at the start, (?P<load1>[0-9. /]+) at the end: "
    r"`(?P<command>bench/[a-z0-9_]+\.py[^`]*)`\.$"
)
SEPARATOR = "|"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")


def loadavg() -> str:
    """/proc/loadavg's 1, 5 and 15 minute figures, as the kernel writes them."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def machine() -> str:
    model = "?"
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                model = ln.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({model.replace('(', '[').replace(')', ']')})"


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return (git("rev-parse", "--short", "HEAD") or "?") + (" (+ uncommitted changes)" if dirty else "")


def cell(value: object) -> str:
    """A value as a table cell: one line, its pipes escaped."""
    return " ".join(str(value).split()).replace(SEPARATOR, "\\" + SEPARATOR)


def split_row(line: str) -> list[str]:
    """A markdown table row's cells (escaped pipes kept inside their cell)."""
    inner = line.strip()
    if not (inner.startswith(SEPARATOR) and inner.endswith(SEPARATOR)):
        raise ValueError(f"not a table row: {line!r}")
    return [c.strip() for c in re.split(r"(?<!\\)\|", inner[1:-1])]


def render(header: tuple[str, ...], rows: list[list[object]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        if len(r) != len(header):
            raise ValueError(f"{len(r)} cells for {len(header)} columns: {r!r}")
        out.append("| " + " | ".join(cell(c) for c in r) + " |")
    return "\n".join(out)


@dataclass
class Parsed:
    name: str
    provenance: dict[str, str]
    header: tuple[str, ...]
    rows: list[list[str]]


def parse_block(name: str, body: str) -> Parsed:
    """A block as the writer writes it: the provenance line, a blank line, the table."""
    lines = body.split("\n")
    if len(lines) < 4 or lines[1] != "":
        raise ValueError(f"bench:{name}: not a provenance line, a blank line and a table")
    m = PROVENANCE.match(lines[0])
    if not m:
        raise ValueError(f"bench:{name}: no provenance line: {lines[0]!r}")
    header = tuple(split_row(lines[2]))
    if lines[3] != "|" + "---|" * len(header):
        raise ValueError(f"bench:{name}: the separator row does not match the header's {len(header)} columns")
    rows = [split_row(ln) for ln in lines[4:]]
    for r in rows:
        if len(r) != len(header):
            raise ValueError(f"bench:{name}: a row of {len(r)} cells under {len(header)} columns: {r!r}")
    return Parsed(name, m.groupdict(), header, rows)


def parse_blocks(text: str) -> list[Parsed]:
    begins = re.findall(r"<!-- bench:([a-z0-9-]+) begin -->", text)
    found = [parse_block(m[1], m[2]) for m in BLOCK.finditer(text)]
    if len(found) != len(begins):
        raise ValueError(f"{len(begins)} begin markers, {len(found)} whole blocks")
    return found


def declared_tables(script: Path) -> dict[str, tuple[str, ...]]:
    """A bench's ``DOC_TABLES`` literal, read without importing the bench."""
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "DOC_TABLES" for t in node.targets
        ):
            return {k: tuple(v) for k, v in ast.literal_eval(node.value).items()}
    return {}


def add_docs_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--docs", action="store_true", help=f"also write the tables into {DOC.relative_to(ROOT)}"
    )


class Recorder:
    """Made at a bench's start (the date, the load then); publishes its tables."""

    def __init__(self, tables: dict[str, tuple[str, ...]], docs: bool = False, doc: Path = DOC) -> None:
        self.tables, self.docs, self.doc = tables, docs, doc
        self.started, self.load0 = _now(), loadavg()
        self.command = " ".join(
            [Path(sys.argv[0]).resolve().relative_to(ROOT).as_posix(), *sys.argv[1:]]
        ).replace(" --docs", "")

    def provenance(self) -> str:
        return (
            f"Ran {self.started} → {_now()} UTC, commit {commit()}, {machine()}, "
            f"load average {self.load0} at the start, {loadavg()} at the end: `{self.command}`."
        )

    def publish(self, name: str, rows: list[list[object]]) -> str:
        """Print the table (with its provenance), and write it into the doc with ``--docs``."""
        body = self.provenance() + "\n\n" + render(self.tables[name], rows)
        print(f"\n{BEGIN.format(name)}\n{body}\n{END.format(name)}", flush=True)
        if self.docs:
            write_block(self.doc, name, body)
        return body


def write_block(doc: Path, name: str, body: str) -> None:
    """Replace the block NAME in DOC (its markers must be there: a section names its tables)."""
    text = doc.read_text()
    begin, end = BEGIN.format(name), END.format(name)
    if begin not in text or end not in text:
        raise SystemExit(f"{doc}: no {begin} ... {end} to write into")
    head, rest = text.split(begin, 1)
    _old, tail = rest.split(end, 1)
    doc.write_text(f"{head}{begin}\n{body}\n{end}{tail}")
