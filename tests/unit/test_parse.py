"""Console parsing: the line splitter and the progress/phase parser, on unit lines and on
recorded real logs (tests/data/logs/, see record.py there)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from trainctl.core.events import Phase, Progress
from trainctl.core.lines import MAX_PARTIAL, LineSplitter
from trainctl.core.parse import ConsoleParser
from trainctl.core.sanitize import CUT_MARK, MAX_LINE, strip_ansi
from trainctl.core.values import parse_rate

LOGS = Path(__file__).resolve().parent.parent / "data" / "logs"
ALL_LOGS = sorted(p.name for p in LOGS.glob("*.log"))

UL_HEADER = "      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size"
BOX3 = ("box_loss", "cls_loss", "dfl_loss")


def progress_of(line: str, parser: ConsoleParser | None = None) -> Progress | None:
    events = (parser or ConsoleParser()).feed(line, 12.5)
    found = [e for e in events if isinstance(e, Progress)]
    assert len(found) <= 1
    return found[0] if found else None


def split_all(data: bytes) -> list[str]:
    s = LineSplitter()
    return s.feed(data) + s.flush()


def events_of(lines: list[str]) -> list:
    p = ConsoleParser()
    return [e for line in lines for e in p.feed(line, 0.0)]


# ---------------------------------------------------------------------------- one line

# (line, epoch, epochs, batch, batches, losses, rate)
FORMATS = [
    pytest.param(
        "        1/1         0G      6.251      4.366      4.362          4        160: 4% "
        "──────────── 1/24 2.8it/s 0.3s<8.3s",
        1,
        1,
        1,
        24,
        dict(zip(BOX3, (6.251, 4.366, 4.362))),
        2.8,
        id="ul84-mid",
    ),
    pytest.param(
        "        1/1         0G      5.645      4.131      3.947          4        160: 100% "
        "━━━━━━━━━━━━ 24/24 13.2it/s 1.8s",
        1,
        1,
        24,
        24,
        dict(zip(BOX3, (5.645, 4.131, 3.947))),
        13.2,
        id="ul84-last",
    ),
    pytest.param(
        "        1/2         0G     0.6628     0.7027     0.3822          7         64: 0% "
        "──────────── 0/2  0.1s",
        1,
        2,
        0,
        2,
        dict(zip(BOX3, (0.6628, 0.7027, 0.3822))),
        None,
        id="ul84-first-no-rate",
    ),
    pytest.param(
        "        2/50      7.81G      1.234     0.8765      1.111         31        640: 11% "
        "━╸────────── 4886/41163 2.5s/it 3:23:45<25:12:01",
        2,
        50,
        4886,
        41163,
        dict(zip(BOX3, (1.234, 0.8765, 1.111))),
        0.4,
        id="ul84-s/it-hours",
    ),
    pytest.param(
        "        3/3         0G      1.0        0.9        1.1          4         64: 50% "
        "━━━━━━────── 500/1000 1.6Kit/s 0.3s<0.3s",
        3,
        3,
        500,
        1000,
        dict(zip(BOX3, (1.0, 0.9, 1.1))),
        1600.0,
        id="ul84-kilo-rate",
    ),
    pytest.param(
        "        5/9         0G        nan        nan        nan          2        640: 12% "
        "━─────────── 3/24 2.0it/s 1.5s<10.5s",
        5,
        9,
        3,
        24,
        dict.fromkeys(BOX3, math.nan),
        2.0,
        id="ul84-nan",
    ),
    pytest.param(
        "     80/400      29.9G     0.6966     0.3341      1.085         31        640: 100%|"
        "██████████| 351/351 [04:18<00:00,  1.36it/s]",
        80,
        400,
        351,
        351,
        dict(zip(BOX3, (0.6966, 0.3341, 1.085))),
        1.36,
        id="ul83-tqdm",
    ),
    pytest.param(
        "      1/400      4.21G        1.2        0.9        1.1         31        640:   0%|"
        "          | 0/351 [00:00<?, ?it/s]",
        1,
        400,
        0,
        351,
        dict(zip(BOX3, (1.2, 0.9, 1.1))),
        None,
        id="ul83-first",
    ),
    pytest.param(
        "      7/100      3.1G     1.4567     0.9…: 40% ━━━━━─────── 40/100 3.3it/s 12.0s<18.0s",
        7,
        100,
        40,
        100,
        {"box_loss": 1.4567},
        3.3,
        id="ul84-desc-cut-by-tty",
    ),
    pytest.param(
        "Epoch 1:   0%|          | 1/18968 [00:05<30:15:42,  5.75s/it]",
        1,
        None,
        1,
        18968,
        {},
        1 / 5.75,
        id="tqdm-s/it",
    ),
    pytest.param(
        " 45%|████▌     | 45/100 [00:10<00:12,  4.40it/s, loss=0.123]",
        None,
        None,
        45,
        100,
        {"loss": 0.123},
        4.4,
        id="tqdm-postfix",
    ),
    pytest.param(
        "Epoch 3/10:  12%|█▏        | 12/100 [00:03<00:20,  4.1it/s, v_num=0, train_loss=nan]",
        3,
        10,
        12,
        100,
        {"train_loss": math.nan},
        4.1,
        id="tqdm-lightning-nan",
    ),
    pytest.param(
        "Epoch 2: 45it [00:10,  4.40it/s, loss=0.1]",
        2,
        None,
        45,
        None,
        {"loss": 0.1},
        4.4,
        id="tqdm-no-total",
    ),
    pytest.param(
        "[rank1]: Epoch 3:  12%|█▏        | 12/100 [00:03<00:20,  4.1it/s]",
        3,
        None,
        12,
        100,
        {},
        4.1,
        id="tqdm-rank-prefix",
    ),
    pytest.param(
        "epoch=2 batch=10/30 loss=0.53 lr=0.001", 2, None, 10, 30, {"loss": 0.53}, None, id="kv-equals"
    ),
    pytest.param("epoch 2/3 step 10/30 loss: 0.53", 2, 3, 10, 30, {"loss": 0.53}, None, id="kv-words"),
    pytest.param("[epoch 2][batch 10/30] loss=0.53", 2, None, 10, 30, {"loss": 0.53}, None, id="kv-brackets"),
    pytest.param(
        "Epoch [2/3], Step [10/30], Loss: nan",
        2,
        3,
        10,
        30,
        {"Loss": math.nan},
        None,
        id="kv-pytorch-tutorial-nan",
    ),
    pytest.param(
        "Epoch: [0]  [  0/1563]  eta: 0:53:53  lr: 0.1  img/s: 48.6  loss: 6.9 (6.9)",
        0,
        None,
        0,
        1563,
        {"loss": 6.9},
        None,
        id="kv-torchvision",
    ),
]


def _same_losses(got: dict[str, float], want: dict[str, float]) -> bool:
    return got.keys() == want.keys() and all(
        (math.isnan(want[k]) and math.isnan(got[k])) or got[k] == pytest.approx(want[k]) for k in want
    )


@pytest.mark.timeout(10)
@pytest.mark.parametrize("line,epoch,epochs,batch,batches,losses,rate", FORMATS)
def test_formats(line, epoch, epochs, batch, batches, losses, rate):
    p = progress_of(line)
    assert p is not None, line
    assert (p.epoch, p.epochs, p.batch, p.batches) == (epoch, epochs, batch, batches)
    assert _same_losses(p.losses, losses), p.losses
    assert p.rate == (pytest.approx(rate) if rate is not None else None)
    assert p.ts == 12.5


NOT_PROGRESS = [
    "",
    "        1/3         0G      1.79      1.213",  # cut before the bar
    "        2/3         0G     0.5269     0.4342     0.3058          4         64: 16% ━━──",  # cut mid-frame
    "        2/3         0G     0.5269     0.4342     0.3058          4         64: 16% ━━────────── 4/2",
    " 45%|████▌     | 45/10",  # tqdm cut mid-count
    "45%|████▌     | 45/100 00:10<00:12",  # no brackets
    "x/y zG: %| | a/b [",  # garbage
    "\ufffd\ufffd 1/\ufffd 0G: 4% ─── \ufffd/24",  # mangled bytes
    "train: Scanning /x/labels/train... 8 images, 0 backgrounds, 0 corrupt: 100% ━━━━━━━━━━━━ 8/8 1.6Kit/s 0.0s",
    "train: Scanning /x/labels/train... 8 images, 0 corrupt: 100%|██████████| 8/8 [00:00<00:00, 123.4it/s]",
    "engine/trainer: agnostic_nms=False, batch=4, epochs=2, lr0=0.01, box=7.5, cls=0.5, dfl=1.5",
    "Starting training for 2 epochs...",
    "Resuming training runs/r/weights/last.pt from epoch 3 to 4 total epochs",
    "                   all          4          8          0          0          0          0",
    "Using 0 dataloader workers",
    "Epoch 1/2",
    "epoch",
    "step 3",
]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("line", NOT_PROGRESS)
def test_not_progress(line):
    assert ConsoleParser().feed(line, 0.0) == []


@pytest.mark.timeout(10)
def test_header_names_the_losses():
    p = ConsoleParser()
    seg = "      Epoch    GPU_mem   box_loss   seg_loss   cls_loss   dfl_loss  Instances       Size"
    assert p.feed(seg, 0.0) == []
    ev = progress_of(
        "        1/3      1.2G      1.1      2.2      3.3      4.4          9        640: 10% "
        "━─────────── 3/30 5.0it/s 0.6s<5.4s",
        p,
    )
    assert ev.losses == {"box_loss": 1.1, "seg_loss": 2.2, "cls_loss": 3.3, "dfl_loss": 4.4}
    # More columns than the header named (e.g. no header seen): extras get positional names.
    ev = progress_of(
        "        1/3      1.2G      1.1      2.2      3.3      4.4      5.5    9    640: 10% "
        "━─────────── 3/30 5.0it/s 0.6s<5.4s",
        ConsoleParser(),
    )
    assert ev.losses == {"box_loss": 1.1, "cls_loss": 2.2, "dfl_loss": 3.3, "loss3": 4.4, "loss4": 5.5}


@pytest.mark.timeout(10)
def test_phases_change_only_on_change():
    p = ConsoleParser()
    frame = (
        "        {e}/2         0G      1.193      1.005     0.7007          8         64: 50% "
        "━━━━━━────── {b}/2 9.4it/s 0.2s<0.2s"
    )
    val = (
        "                 Class     Images  Instances      Box(P          R      mAP50  mAP50-95): 100% "
        "━━━━━━━━━━━━ 1/1 23.9it/s 0.0s"
    )
    feed = [
        UL_HEADER,
        frame.format(e=1, b=1),
        frame.format(e=1, b=2),
        val,
        val,
        "                   all          4          8          0          0          0          0",
        UL_HEADER,
        frame.format(e=2, b=1),
        val,
        "2 epochs completed in 0.000 hours.",
        "Validating /tmp/r/weights/best.pt...",
        val,
    ]
    kinds = [
        (type(e).__name__, getattr(e, "phase", getattr(e, "batch", None)))
        for line in feed
        for e in p.feed(line, 0.0)
    ]
    assert kinds == [
        ("Phase", "train"),
        ("Progress", 1),
        ("Progress", 2),
        ("Phase", "val"),
        ("Phase", "train"),
        ("Progress", 1),
        ("Phase", "val"),
        ("Phase", "finished"),
    ]
    assert p.phase == "finished"


@pytest.mark.timeout(10)
def test_generic_val_bar_is_a_phase_not_progress():
    p = ConsoleParser()
    assert p.feed("Epoch 1:  50%|█████     | 5/10 [00:01<00:01,  4.5it/s]", 0.0)[0] == Phase(0.0, "train")
    assert p.feed("Validation DataLoader 0:  50%|█████     | 5/10 [00:01<00:01,  4.5it/s]", 1.0) == [
        Phase(1.0, "val")
    ]
    assert p.feed("Validation DataLoader 0: 100%|██████████| 10/10 [00:01<00:00,  4.5it/s]", 2.0) == []


@pytest.mark.timeout(10)
def test_ultralytics_mode_ignores_generic_bars():
    p = ConsoleParser()
    p.feed(UL_HEADER, 0.0)
    assert p.feed(" 45%|████▌     | 45/100 [00:10<00:12,  4.40it/s, loss=0.123]", 0.0) == []
    assert p.feed("epoch=2 batch=10/30 loss=0.53", 0.0) == []


@pytest.mark.timeout(10)
def test_standalone_epoch_line_gives_context_to_bars():
    p = ConsoleParser()
    assert p.feed("Epoch 4/10", 0.0) == []
    ev = progress_of(" 10%|█         | 3/30 [00:00<00:08,  3.2it/s]", p)
    assert (ev.epoch, ev.epochs, ev.batch) == (4, 10, 3)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "text,rate",
    [
        (" 2.8it/s 0.3s<8.3s", 2.8),
        (" [00:05<30:15:42,  5.75s/it]", 1 / 5.75),
        ("  0.1s", None),
        (" 1.6Kit/s 0.0s", 1600.0),
        (" 2.0Mit/s", 2e6),
        (" 3.2kit/s", 3200.0),
        (" [00:00<?, ?it/s]", None),
        (" 0.0it/s", None),
        ("it/s", None),
    ],
)
def test_parse_rate(text, rate):
    assert parse_rate(text) == (pytest.approx(rate) if rate is not None else None)


@pytest.mark.timeout(10)
def test_strip_ansi():
    assert strip_ansi("\x1b[34m\x1b[1mtrain: \x1b[0mScanning") == "train: Scanning"
    assert strip_ansi("\x1b[K  1/2 \x1b]0;title\x07x\x1b[?25l") == "  1/2 x"
    assert strip_ansi("plain") == "plain"


# ---------------------------------------------------------------------------- splitter


@pytest.mark.timeout(10)
def test_splitter_frames_without_newline():
    s = LineSplitter()
    assert s.feed(b"header\n\r\x1b[K  1/2 frame one") == ["header"]
    assert s.feed(b"\r\x1b[K  1/2 frame two") == ["  1/2 frame one"]
    assert s.feed(b"\r\n\n\r\r") == ["  1/2 frame two"]
    assert s.feed(b"tail without end  ") == []
    assert s.flush() == ["tail without end"]
    assert s.flush() == []


@pytest.mark.timeout(10)
def test_splitter_multibyte_split_and_invalid_bytes():
    data = "━━ 1/2 ✅ done\n".encode()
    s = LineSplitter()
    out = [line for b in data for line in s.feed(bytes([b]))]
    assert out == ["━━ 1/2 ✅ done"]
    assert split_all(b"bad \xff\xfe bytes\nend \xe2\x94") == ["bad \ufffd\ufffd bytes", "end \ufffd"]


@pytest.mark.timeout(10)
def test_splitter_caps_a_line_that_never_ends():
    s = LineSplitter(max_line=10**9)  # the pieces whole, to count them
    out = []
    for _ in range(40):
        out += s.feed(b"x" * 10_000)
        assert s.pending <= MAX_PARTIAL
    out += s.feed(b"\n") + s.flush()
    assert [len(x) for x in out] == [MAX_PARTIAL] * 6 + [400_000 - 6 * MAX_PARTIAL]
    s = LineSplitter()  # and each is cut to MAX_LINE
    out = [line for _ in range(40) for line in s.feed(b"x" * 10_000)] + s.feed(b"\n")
    assert [len(x) for x in out] == [MAX_LINE] * 7
    assert all(x.endswith(CUT_MARK) for x in out)


@pytest.mark.timeout(60)
def test_splitter_every_two_chunk_cut_of_a_real_log():
    data = (LOGS / "ultralytics84_cpu.log").read_bytes()
    whole = split_all(data)
    assert b"\r\x1b[K" in data  # the recording kept its raw frames
    assert not any("\x1b" in line or "\r" in line for line in whole)
    for k in range(len(data) + 1):
        s = LineSplitter()
        assert s.feed(data[:k]) + s.feed(data[k:]) + s.flush() == whole, k


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ALL_LOGS)
def test_splitter_random_chunkings(name):
    data = (LOGS / name).read_bytes()
    whole = split_all(data)
    rng = random.Random(name)
    for _ in range(30):
        s, out, i = LineSplitter(), [], 0
        while i < len(data):
            n = rng.choice((1, 2, 3, 7, 64, 1000))
            out += s.feed(data[i : i + n])
            i += n
        assert out + s.flush() == whole


# ---------------------------------------------------------------------------- recorded logs


def _progress(name: str) -> tuple[list, list[Progress]]:
    events = events_of(split_all((LOGS / name).read_bytes()))
    return events, [e for e in events if isinstance(e, Progress)]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name,epochs", [("ultralytics84_cpu.log", 2), ("ultralytics84_cpu_long.log", 3)])
def test_recorded_ultralytics84(name, epochs):
    events, progress = _progress(name)
    assert progress, "no progress parsed"
    assert {p.epochs for p in progress} == {epochs}
    assert [p.epoch for p in progress] == sorted(p.epoch for p in progress)
    assert progress[-1].epoch == epochs
    for e in range(1, epochs + 1):
        batches = [p.batch for p in progress if p.epoch == e]
        assert batches == sorted(batches) and batches[-1] == progress[-1].batches, (e, batches)
    assert all(tuple(p.losses) == BOX3 for p in progress)
    assert all(p.rate is None or p.rate > 0 for p in progress)
    assert any(p.rate is None for p in progress)  # the first frame of epoch 1 has no rate
    phases = [e.phase for e in events if isinstance(e, Phase)]
    assert phases == ["train", "val"] * epochs + ["finished"]


@pytest.mark.timeout(30)
def test_recorded_ultralytics83_reconstruction():
    events, progress = _progress("ultralytics83_tqdm.log")
    assert [p.epoch for p in progress][-1] == 3 and {p.batches for p in progress} == {20}
    assert any(math.isnan(p.losses["box_loss"]) for p in progress if p.epoch == 3)
    assert not any(math.isnan(v) for p in progress if p.epoch < 3 for v in p.losses.values())
    assert [e.phase for e in events if isinstance(e, Phase)] == ["train", "val"] * 3 + ["finished"]


@pytest.mark.timeout(30)
def test_recorded_tqdm_generic():
    events, progress = _progress("tqdm_generic.log")
    assert [e.phase for e in events if isinstance(e, Phase)] == ["train", "val", "train", "val", "train"]
    assert progress[0].epoch == 1 and progress[0].epochs == 2  # from the "Epoch 1/2" line
    assert any(p.rate is not None and p.rate < 1 for p in progress)  # the slow s/it step
    assert any(p.losses.get("loss") for p in progress if p.epoch == 2)
    assert progress[-1].epoch == 3 and progress[-1].batches is None and progress[-1].batch == 12


@pytest.mark.timeout(30)
def test_recorded_keyvalue():
    _, progress = _progress("keyvalue.log")
    assert len(progress) == 28
    assert [p.epoch for p in progress] == sorted(p.epoch for p in progress)
    assert math.isnan(progress[-1].losses["Loss"]) and progress[-1].batch == 30


# ---------------------------------------------------------------------------- issue 26: generic readers


def _counter_corpus():
    path = Path(__file__).resolve().parents[1] / "data" / "progress_counter_lines.txt"
    for raw in path.read_text(encoding="utf-8").splitlines():
        if not raw.strip() or raw.startswith("#"):
            continue
        head, _, line = raw.partition(" | ")
        yield pytest.param(head.split(), line, id=line[:50])


@pytest.mark.parametrize("head,line", list(_counter_corpus()))
def test_generic_counter_corpus(head, line):
    """Each line of tests/data/progress_counter_lines.txt, read by a fresh parser."""
    events = [e for e in ConsoleParser().feed(line, 1.0) if isinstance(e, Progress)]
    if head[0] == "-":
        assert events == [], (line, events)
        return
    assert len(events) == 1, (line, events)
    ev = events[0]
    epoch = None if head[1] == "-" else int(head[1])
    batch, batches = head[2].split("/")
    assert (ev.epoch, ev.batch, ev.batches) == (
        epoch,
        int(batch),
        None if batches == "-" else int(batches),
    ), (line, ev)
    for pair in head[3:]:  # the losses it must read ("{}": none)
        if pair == "{}":
            assert ev.losses == {}, (line, ev.losses)
            continue
        name, _, value = pair.partition("=")
        assert ev.losses.get(name) == float(value), (line, ev.losses)


def test_the_issues_torchrun_line_reads_as_progress_with_its_rank_and_loss():
    ev = ConsoleParser().feed("[rank0] Epoch 2/3:  25%| 5/20 [00:00, 17.14it/s, loss=1.3007]", 1.0)[-1]
    assert isinstance(ev, Progress) and ev.rank == 0 and ev.losses == {"loss": 1.3007}
    assert ev.rate == pytest.approx(17.14)
