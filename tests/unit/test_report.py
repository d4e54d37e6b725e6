"""`trainctl report` (src/trainctl/report/) on journals written by the project's own writer."""

from __future__ import annotations

import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

from trainctl.core import events as E
from trainctl.report.collect import collect
from trainctl.report.render import html_report, markdown_report
from trainctl.store.journal import Journal

HOSTILE = '<script>alert(1)</script>\x1b[31m\x1b]0;title\x07 & "quoted"'


def write_run(run_dir: Path, job: str = "yolo", text: str = "a worker in futex_wait") -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "spec.json").write_text(json.dumps({"job_name": job}))
    j = Journal(run_dir / "events.jsonl")
    t = 1.76e9
    evs: list[E.Event] = [E.Start(t, 1, 10, "A"), E.Phase(t, "startup"), E.Phase(t + 5, "train")]
    evs += [
        E.Progress(t + 5 + i, 1, 2, i, 20, {"box_loss": 2 - i / 20, "cls_loss": 1.0}) for i in range(1, 11)
    ]
    evs += [E.Projection(t + 15, t + 60, t + 100, 40, 1.0, None, None, rate_source="measured")]
    evs += [E.Checkpoint(t + 15, "/runs/ck.pt", 1, batch=10, kind="periodic")]
    evs += [
        E.State(t + 25, "STALLED", "no batch for 10 s"),
        E.Stall(t + 26, "train", 10.0, "deadlock", detail=text),
    ]
    evs += [E.State(t + 27, "STOPPING", "stall"), E.Exit(t + 28, -15, "SIGTERM"), E.State(t + 28, "BACKOFF")]
    evs += [E.Restart(t + 28, 2, "stalled: falling back from A to B", "B", "/runs/ck.pt", 1.0)]
    evs += [E.Start(t + 29, 2, 11, "B"), E.Phase(t + 29, "startup"), E.Phase(t + 34, "train")]
    evs += [
        E.Progress(t + 34 + i, 1, 2, i, 20, {"box_loss": 1.5 - i / 40, "cls_loss": 0.9})
        for i in range(10, 21)
    ]
    evs += [E.Projection(t + 45, t + 55, t + 100, 45, 1.0, None, None, rate_source="measured", finished=True)]
    evs += [E.Exit(t + 55, 0), E.State(t + 55, "FINISHED", "the trainer finished")]
    for e in evs:
        j.append(e)
    j.close()
    return run_dir


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def parsed(page: str) -> Tags:
    p = Tags()
    p.feed(page)
    p.close()
    return p


def test_the_html_report_parses_has_its_charts_and_nothing_from_the_network(tmp_path):
    r = collect(write_run(tmp_path / "run"))
    page = html_report(r)
    p = parsed(page)
    tags = [t for t, _ in p.tags]
    assert tags.count("svg") >= 4  # goodput bar, losses, rate, projected end
    assert tags.count("polyline") >= 4
    assert "script" not in tags
    for _, attrs in p.tags:  # no URL anywhere but the SVG namespace
        for k, v in attrs.items():
            assert k not in ("src", "href") and not (v or "").startswith("http") or k == "xmlns"
    text = " ".join(p.text)
    for word in ("Goodput", "deadlock", "falling back from A to B", "/runs/ck.pt", "box_loss", "FINISHED"):
        assert word in text
    g = r.goodput
    assert abs(g["productive_s"] + sum(g["buckets"].values()) - g["wall_s"]) <= 0.01 * g["wall_s"]
    assert [i.kind for i in r.incidents] == ["stall"] and r.incidents[0].cost_s == 44 - 15
    assert [a["preset"] for a in r.attempts if not a.get("restart")] == ["A", "B"]


def test_journal_text_is_escaped_in_html_and_markdown(tmp_path):
    r = collect(write_run(tmp_path / "run", job=HOSTILE, text=HOSTILE))
    page = html_report(r)
    assert "<script>" not in page and "\x1b" not in page and "\x07" not in page
    assert "&lt;script&gt;" in page
    assert [t for t, _ in parsed(page).tags].count("script") == 0
    md = markdown_report(r)
    assert "<script>" not in md and "\x1b" not in md


def test_markdown_has_the_same_numbers(tmp_path):
    r = collect(write_run(tmp_path / "run"))
    md = markdown_report(r)
    from trainctl.core.goodput import describe

    assert describe(r.goodput) in md and describe(r.goodput) in html_report(r).replace("&middot;", "·")
    assert "| 1 | stall | no batch for 10 s in train: deadlock; a worker in futex_wait | 29 s |" in md
    assert "charts in the HTML report" in md


def test_a_torn_last_line_and_a_live_run(tmp_path):
    run = write_run(tmp_path / "run")
    journal = run / "events.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join(lines[:30]) + b'{"ts":1760000040.0,"type":"prog')  # cut mid-write
    r = collect(run)
    assert r.live and r.state == "BACKOFF" and r.events == 30  # the lines before the torn one
    assert "<svg" in html_report(r)


def test_the_command_writes_the_file_and_prints_its_path(tmp_path):
    run = write_run(tmp_path / "run")
    env_cmd = [sys.executable, "-m", "trainctl", "report", str(run)]
    out = subprocess.run(env_cmd, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == str(run / "report.html") and (run / "report.html").is_file()
    out = subprocess.run(
        [*env_cmd, "--md", "-o", str(tmp_path / "r.md")], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and (tmp_path / "r.md").read_text().startswith("# yolo")
    bad = subprocess.run(
        [sys.executable, "-m", "trainctl", "report", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "trainctl:" in bad.stderr and "Traceback" not in bad.stderr


def test_a_stall_said_at_detection_shows_its_later_verdict(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "spec.json").write_text(json.dumps({"job_name": "loop"}))
    j = Journal(run / "events.jsonl")
    t = 1.76e9
    for e in [
        E.Start(t, 1, 10, "A"),
        E.Progress(t + 1, 1, 2, 1, 20, {"loss": 1.0}),
        E.Stall(t + 6, "train", 5.0, E.DIAGNOSING),
        E.StallDiagnosis(t + 8, "train", "deadlock", detail="a worker in futex_wait"),
        E.Exit(t + 9, -9, "SIGKILL"),
    ]:
        j.append(e)
    j.close()
    (stall,) = [i for i in collect(run).incidents if i.kind == "stall"]
    assert stall.text == "no batch for 5 s in train: deadlock; a worker in futex_wait"


def test_a_run_resumed_from_files_never_journaled_as_checkpoints_lists_them(tmp_path):
    """A run that resumed twice (a `--resume-from` file, a rescue save) with no checkpoint
    event: the report lists what each restart went on from, never just "none"."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "spec.json").write_text(json.dumps({"job_name": "loop"}))
    j = Journal(run_dir / "events.jsonl")
    t = 1.76e9
    evs: list[E.Event] = [E.Start(t, 1, 10, "A"), E.Progress(t + 1, 1, 1, 5, 20, {"loss": 1.0})]
    evs += [E.Restart(t + 10, 2, "the trainer stalled", "A", "/data/rescue-1.pt", 1.0)]
    evs += [E.Start(t + 11, 2, 11, "A"), E.Progress(t + 12, 1, 1, 9, 20, {"loss": 0.9})]
    evs += [E.Restart(t + 20, 3, "the trainer stalled", "B", "/data/rescue-2.pt", 1.0)]
    evs += [
        E.Start(t + 21, 3, 12, "B"),
        E.Exit(t + 30, 0),
        E.State(t + 30, "FINISHED", "the trainer finished"),
    ]
    for e in evs:
        j.append(e)
    j.close()
    r = collect(run_dir)
    md = markdown_report(r)
    part = md[md.index("## Checkpoints") :]
    assert "no checkpoint journaled" in part
    assert "| 2 |" in part and "/data/rescue-1.pt" in part and "| 3 |" in part and "/data/rescue-2.pt" in part
    html = html_report(r)
    assert "/data/rescue-1.pt" in html[html.index("Resumed from") :]
    assert "/data/rescue-2.pt" in html[html.index("Resumed from") :]


def test_the_checkpoint_a_restart_resumed_from_is_listed_with_its_attempt(tmp_path):
    md = markdown_report(collect(write_run(tmp_path / "run")))
    part = md[md.index("### Resumed from") :]
    assert "| 2 |" in part and "/runs/ck.pt" in part  # the one restart, from the periodic save
