"""`trainctl scan`: postmortem of recorded real logs, whole and cut where a run would stop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainctl.agent.scan import format_report, main_scan, report_to_dict, scan_log
from trainctl.core.events import Warning as WarningEvent
from trainctl.core.signatures import Catalog

LOGS = Path(__file__).resolve().parent.parent / "data" / "logs"
LONG = LOGS / "ultralytics84_cpu_long.log"


class FakeMatcher:
    """Reports 'Closing dataloader mosaic' once, counting repeats, like the real matcher."""

    def __init__(self) -> None:
        self.n = 0

    def feed(self, line: str, now: float, source: str = "trainer") -> WarningEvent | None:
        if "dataloader mosaic" not in line:
            return None
        self.n += 1
        if self.n > 1:
            return None
        return WarningEvent(
            now, id="test.mosaic", severity="info", text=line.strip(), advice="nothing to do", source=source
        )

    def counts(self) -> dict[str, int]:
        return {"test.mosaic": self.n} if self.n else {}


def _cut_after(data: bytes, marker: bytes, nth: int = 1) -> bytes:
    """``data`` up to the end of the nth frame that contains ``marker`` (a run stopping there)."""
    pos = -1
    for _ in range(nth):
        pos = data.index(marker, pos + 1)
    end = data.find(b"\r", pos)
    return data[:end]


@pytest.mark.timeout(30)
def test_scan_finished_run():
    r = scan_log(LONG, matcher=FakeMatcher())
    assert r.finished and r.last_phase == "finished"
    assert r.phases == ("train", "val") * 3 + ("finished",)
    assert (r.first_progress.epoch, r.first_progress.batch) == (1, 0)
    lp = r.last_progress
    assert (lp.epoch, lp.epochs, lp.batch, lp.batches) == (3, 3, 24, 24)
    assert set(lp.losses) == {"box_loss", "cls_loss", "dfl_loss"}
    assert r.where.startswith("finished; last progress in epoch 3/3 at batch 24/24, box_loss ")
    assert r.tail[-1].startswith("Speed:") and r.lines_after_progress >= len(r.tail)
    [w] = r.warnings
    assert (w.id, w.count, w.first_line, w.advice) == (
        "test.mosaic",
        1,
        "Closing dataloader mosaic",
        "nothing to do",
    )


@pytest.mark.timeout(30)
def test_scan_run_stopped_mid_epoch(tmp_path):
    data = LONG.read_bytes()
    log = tmp_path / "train.log"
    log.write_bytes(_cut_after(data, b"        2/3 ", nth=9))
    r = scan_log(log, matcher=FakeMatcher())
    lp = r.last_progress
    assert (lp.epoch, lp.epochs, lp.batches) == (2, 3, 24) and 0 < lp.batch < 24
    assert not r.finished and r.phases == ("train", "val", "train")
    losses = " ".join(f"{k} {v:.4g}" for k, v in lp.losses.items())
    assert lp.losses and r.where == (
        f"stopped in epoch 2/3 at batch {lp.batch}/24, {losses}, phase train, "
        "the last line is a progress line"
    )
    assert r.lines_after_progress == 0 and r.tail == ()


@pytest.mark.timeout(30)
def test_scan_run_stopped_after_validation_with_a_real_warning(tmp_path):
    """A hang right after validation (the seeds' hang), then a DataLoader worker killed."""
    data = LONG.read_bytes()
    cut = data[: data.index(b"\n", data.index(b"   all   ")) + 1]  # epoch 1's val result line
    killed = "RuntimeError: DataLoader worker (pid 4161) is killed by signal: Killed."
    log = tmp_path / "train.log"
    log.write_bytes(cut + f"Traceback (most recent call last):\n{killed}\n".encode())
    expected = Catalog.load().match(killed)
    assert expected is not None
    r = scan_log(log)  # the real signature catalog
    assert r.phases == ("train", "val") and r.last_phase == "val"
    assert r.where.startswith(
        "stopped in epoch 1/3 at batch 24/24, box_loss 1.115 cls_loss 0.7919 "
        "dfl_loss 0.6724, phase val, after the last progress line 4 lines from the end"
    )
    assert r.tail[-1] == killed
    assert [(w.id, w.severity, w.first_line) for w in r.warnings] == [
        (expected.id, expected.severity, killed)
    ]
    text = format_report(r)
    assert "phase val" in text and killed in text and expected.id in text


@pytest.mark.timeout(30)
def test_scan_without_progress(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(LONG.read_bytes().split(b"Starting training")[0])
    r = scan_log(log, matcher=FakeMatcher())
    assert r.last_progress is None and r.phases == ()
    assert r.where == f"no training progress in {r.lines} lines (phase startup)"


@pytest.mark.timeout(30)
def test_report_to_dict_is_json_with_nan_as_text():
    d = report_to_dict(scan_log(LOGS / "keyvalue.log", matcher=FakeMatcher()))
    back = json.loads(json.dumps(d, allow_nan=False))
    assert back["last_progress"]["losses"] == {"Loss": "nan"}
    assert back["where"].startswith("stopped in epoch 3/3 at batch 30/30")
    assert back["tail"] == ["done"]


@pytest.mark.timeout(30)
def test_main_scan(tmp_path, capsys):
    assert main_scan(str(LOGS / "ultralytics84_cpu.log"), as_json=False) == 0
    out = capsys.readouterr().out
    assert "finished; last progress in epoch 2/2 at batch 2/2" in out
    assert main_scan(str(LOGS / "ultralytics84_cpu.log"), as_json=True) == 0
    assert json.loads(capsys.readouterr().out)["finished"] is True
    missing = tmp_path / "nope.log"
    assert main_scan(str(missing), as_json=False) == 2
    assert str(missing) in capsys.readouterr().err
    assert main_scan(str(tmp_path), as_json=True) == 2
    assert "is a directory" in capsys.readouterr().err


def test_scan_exits_1_on_a_fatal_finding_and_0_without(tmp_path, capsys):
    """Issue 28: a log with a fatal finding is not a clean scan (scripts test the exit code)."""
    log = tmp_path / "train.log"
    log.write_text("epoch 1/2 batch 1/10 loss=0.5\n")
    assert main_scan(str(log), as_json=False) == 0
    log.write_text(
        "epoch 1/2 batch 1/10 loss=0.5\nRuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    for as_json in (False, True):
        assert main_scan(str(log), as_json) == 1
    assert "fatal" in capsys.readouterr().out


def test_scan_output_carries_no_escape_sequence(tmp_path, capsys):
    """Issue 14: malformed sequences, ESC c, ESC ( 0, C1 and SO/SI passed into scan's output."""
    import re

    payloads = ["\x1b\b]52;c;Y3VybA==\x1b\b\\", "\x1bc", "\x1b(0", "\x9d0;t\x07", "\x0e\x0f", "\x1b]0;t"]
    log = tmp_path / "train.log"
    log.write_bytes(
        (
            "epoch 1/2 batch 1/10 loss=0.5\n"
            + "".join(f"torch.OutOfMemoryError: CUDA out of memory {p} x\n" for p in payloads)
            + "".join(f"after {p} y\r" for p in payloads)
        ).encode()
    )
    bad = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # newline separates the report's lines
    for as_json in (False, True):
        assert main_scan(str(log), as_json) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and not bad.search(out)
        assert "after" in out


def test_explain_names_the_reader_of_each_line_and_what_it_read(tmp_path, capsys):
    import json as _json

    from trainctl.agent.scan_explain import main_explain

    log = tmp_path / "train.log"
    log.write_bytes(
        b"Epoch 1/5\n  32/1875 [>....] - ETA: 10s - loss: 0.5012\rhello\n"
        b"it 7/90 L=0.25\n{'loss': 2.3, 'grad_norm': 1.0, 'epoch': 0.4}\n"
    )
    job = tmp_path / "trainctl.toml"
    job.write_text(
        'kind = "command"\ncommand = ["true"]\n[progress]\n'
        "pattern = 'it (?P<batch>\\d+)/(?P<batches>\\d+) L=(?P<loss>[\\d.]+)'\n"
    )
    assert main_explain(str(log), as_json=True, job=str(job)) == 0
    rows = [_json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["parser"] for r in rows] == ["epoch_header", "keras", None, "user", "hf_dict"]
    keras = [e for e in rows[1]["events"] if e["type"] == "progress"][0]
    assert (keras["epoch"], keras["batch"], keras["batches"], keras["losses"]) == (
        1,
        32,
        1875,
        {"loss": 0.5012},
    )
    assert rows[3]["events"][0]["losses"] == {"loss": 0.25}
    assert main_explain(str(log), as_json=False) == 0
    text = capsys.readouterr().out.splitlines()
    assert "keras" in text[1] and "epoch 1/5, batch 32/1875; loss 0.5012" in text[1]
    assert text[3].split()[1] == "-"  # no [progress] given: nobody reads "it 7/90"
    assert main_explain(str(tmp_path / "nope.log"), as_json=False) == 2


# ---------------------------------------------------------------- issue 16: --kernel-log


def _scan_kernel(tmp_path, log_text: str, kernel_text: str) -> tuple[int, dict, str]:
    import contextlib as _cl
    import io as _io
    import json as _json

    from trainctl.agent.scan import main_scan

    log, kern = tmp_path / "train.log", tmp_path / "kern.log"
    log.write_text(log_text)
    kern.write_text(kernel_text)
    out = _io.StringIO()
    with _cl.redirect_stdout(out):
        rc = main_scan(str(log), True, str(kern))
    text = _io.StringIO()
    with _cl.redirect_stdout(text):
        main_scan(str(log), False, str(kern))
    return rc, _json.loads(out.getvalue())["kernel"], text.getvalue()


KERNEL_T = (  # dmesg -T; the wordings are the catalog's own examples (journalctl lines there)
    "[Tue Feb 25 19:15:16 2025] amdgpu 0000:03:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:32 vmid:0 pasid:0)\n"
    "[Tue Feb 25 19:15:20 2025] usb 1-1: new high-speed USB device number 2\n"
)


def test_kernel_log_is_interleaved_with_a_timed_trainer_log(tmp_path):
    log = (
        "2025-02-25 19:15:10 INFO epoch 1 step 10 loss 0.5\n"
        "2025-02-25 19:15:18 ERROR RuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    rc, section, text = _scan_kernel(tmp_path, log, KERNEL_T)
    assert rc == 1 and section["interleaved"] is True  # the illegal memory access is fatal
    order = [(f["source"], f["id"]) for f in section["timeline"]]
    assert order[0] == ("kernel", "kernel.amdgpu.vm_page_fault"), order  # 19:15:16 before 19:15:18
    assert order[1][0] == "trainer"
    assert "Kernel log" in text and "kernel.amdgpu.vm_page_fault" in text


def test_kernel_findings_are_listed_apart_when_the_trainer_log_has_no_times(tmp_path):
    rc, section, text = _scan_kernel(tmp_path, "epoch 1 loss 0.5\n", KERNEL_T)
    assert rc == 0 and section["interleaved"] is False and "no timestamps" in section["why"]
    assert [f["id"] for f in section["kernel"]] == ["kernel.amdgpu.vm_page_fault"]
    assert "listed apart" in text


def test_scan_merges_the_last_counter_with_a_loss_only_line(tmp_path):
    """Issue 26: HF Trainer prints its tqdm bar, then ``{'loss': ...}``: the summary keeps
    the batch counter read before the loss line ("stopped in epoch 1 at batch 200/1000,
    loss 2.1"), and a counter line with no loss keeps the last losses."""
    log = tmp_path / "train.log"
    log.write_text(
        " 20%|██        | 200/1000 [01:02<04:10,  3.19it/s]\n"
        "{'loss': 2.1, 'grad_norm': 1.5, 'learning_rate': 5e-05, 'epoch': 0.2}\n"
        "some other line\n",
        encoding="utf-8",
    )
    r = scan_log(log, matcher=FakeMatcher())
    lp = r.last_progress
    assert (lp.epoch, lp.batch, lp.batches, lp.losses) == (1, 200, 1000, {"loss": 2.1}), lp
    assert r.where == (
        "stopped in epoch 1 at batch 200/1000, loss 2.1, phase train, "
        "after the last progress line 1 line from the end"
    )
    log.write_text(
        "{'loss': 2.1, 'epoch': 0.2}\n 21%|██        | 210/1000 [01:05<04:08,  3.19it/s]\n", encoding="utf-8"
    )
    lp = scan_log(log, matcher=FakeMatcher()).last_progress
    assert (lp.epoch, lp.batch, lp.losses) == (1, 210, {"loss": 2.1}), lp


def test_merged_progress_keeps_only_what_the_same_rank_said_in_the_same_epoch():
    from trainctl.core.events import Progress, merged_progress

    bar = Progress(1.0, None, None, 200, 1000, {}, rate=3.2)
    loss = Progress(2.0, 1, None, None, None, {"loss": 2.1})
    m = merged_progress(bar, loss)
    assert (m.epoch, m.batch, m.batches, m.losses, m.ts) == (1, 200, 1000, {"loss": 2.1}, 2.0)
    other_epoch = Progress(3.0, 2, None, None, None, {"loss": 1.0})
    assert merged_progress(Progress(1.0, 1, None, 9, 10, {}), other_epoch).batch is None
    other_rank = Progress(3.0, 1, None, None, None, {"loss": 1.0}, rank=1)
    assert merged_progress(Progress(1.0, 1, None, 9, 10, {}, rank=0), other_rank).batch is None
    assert merged_progress(None, loss) is loss
