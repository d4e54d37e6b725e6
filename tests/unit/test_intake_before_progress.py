"""The before_progress rule of the catalog (src/trainctl/agent/intake.py Intake.on_warning): a
start-up error's wording ("No CUDA GPUs are available", ModuleNotFoundError) ends the run
FAILED only before the attempt's first batch; after a batch the same line is a warning.
Real lines through the real OutputFeed, parser and catalog; only the clock is a counter."""

from __future__ import annotations

import itertools

import pytest

from trainctl.agent.context import RunConfig, RunContext
from trainctl.agent.intake import Intake
from trainctl.core import events as E
from trainctl.core.signatures import Catalog
from trainctl.store.journal import Journal, read_events
from trainctl.store.paths import RunFiles
from trainctl.store.spec import RunSpec

pytestmark = pytest.mark.timeout(20)

NO_DEVICE = b"RuntimeError: No CUDA GPUs are available\n"
NO_MODULE = b"ModuleNotFoundError: No module named 'torch'\n"
BATCH = b"Epoch 2/10: 37/500 loss=0.41\n"  # a plain loop's progress line


def context(tmp_path, clock) -> RunContext:
    """A context as the service builds one, without an agent: given its journal and catalog."""
    files = RunFiles(tmp_path)
    return RunContext(
        RunConfig(files, RunSpec("t", "command", ["python", "train.py"]), clock),
        Journal(files.events),
        Catalog.load(),
    )


def intake(tmp_path) -> Intake:
    ticks = itertools.count(1000.0, 0.5)
    ctx = context(tmp_path, lambda: next(ticks))
    taken = Intake(ctx)
    taken.begin(ctx.clock())
    return taken


def warnings(taken: Intake) -> list[str]:
    return [ev.id for ev in read_events(taken.ctx.files.events) if isinstance(ev, E.Warning)]


@pytest.mark.parametrize("line,sig", [(NO_DEVICE, "rt.no_device"), (NO_MODULE, "py.import_error")])
def test_before_the_first_batch_a_start_up_error_is_fatal(tmp_path, line, sig):
    taken = intake(tmp_path)
    taken.on_output(b"loading model...\n" + line)
    assert not taken.seen_progress
    assert taken.fatal_stop is not None and taken.fatal_stop.startswith(f"{sig}: ")
    assert line.decode().strip() in taken.fatal_stop
    assert warnings(taken) == [sig]


@pytest.mark.parametrize("line,sig", [(NO_DEVICE, "rt.no_device"), (NO_MODULE, "py.import_error")])
def test_after_the_first_batch_the_same_line_is_only_a_warning(tmp_path, line, sig):
    taken = intake(tmp_path)
    taken.on_output(BATCH)
    assert taken.seen_progress and taken.ctx.facts.furthest == (2, 37)
    taken.on_output(line)
    assert taken.fatal_stop is None
    assert warnings(taken) == [sig]  # still reported, with its advice


def test_a_new_attempt_is_before_its_first_batch_again(tmp_path):
    taken = intake(tmp_path)
    taken.on_output(BATCH)
    taken.begin(taken.ctx.clock())  # the restart: a new trainer, no batch yet
    assert not taken.seen_progress
    taken.on_output(NO_DEVICE)
    assert taken.fatal_stop is not None and taken.fatal_stop.startswith("rt.no_device: ")


def test_a_signature_without_before_progress_stays_fatal_after_progress(tmp_path):
    taken = intake(tmp_path)
    taken.on_output(BATCH)
    taken.on_output(b"torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:\n")
    assert taken.fatal_stop is None  # suggest_preset, not stop: no fatal stop either way
    taken.on_output(b"RuntimeError: CUDA error: device-side assert triggered\n")
    assert taken.fatal_stop is not None and taken.fatal_stop.startswith("rt.device_assert: ")


def _unknown_output(taken: Intake, now: list[float], lines: int) -> None:
    for i in range(lines):  # bursts a second apart, in no format trainctl knows
        now[0] += 1.0
        taken.on_output(f"step {i} of something\n".encode())


def _said(taken: Intake) -> list[str]:
    return [
        ev.key
        for ev in read_events(taken.ctx.files.events)
        if isinstance(ev, E.Info) and ev.key == "no_progress_format"
    ]


@pytest.mark.parametrize("attaches", [True, False])
def test_no_progress_format_is_not_said_where_an_integration_attaches(tmp_path, attaches):
    """Zero-code: the integration's "attached" comes on the side channel, read at other
    moments than the console; the run is not also said to have no progress format."""
    now = [1000.0]
    ctx = context(tmp_path, lambda: now[0])
    ctx.facts.instrumented = True
    taken = Intake(ctx)
    taken.begin(now[0])
    _unknown_output(taken, now, 21)  # an unknown format: 20 lines with no progress read
    assert ctx.detector.watching_silence and _said(taken) == []  # not yet: 2 s for the side channel
    if attaches:
        now[0] += 0.5
        taken.on_side_line(
            E.encode(
                E.Info(now[0], "integration attached: ultralytics 8.4.190", "instrument.attached.ultralytics")
            ).encode()
        )
    for _ in range(6):
        now[0] += 0.5
        taken.say_unknown_format(now[0])  # the watch loop, every 0.5 s
    _unknown_output(taken, now, 3)
    assert _said(taken) == []  # a minute of output first
    now[0] += 40.0
    _unknown_output(taken, now, 3)
    assert _said(taken) == ([] if attaches else ["no_progress_format"])


def test_no_progress_format_is_never_said_when_progress_is_read_a_second_later(tmp_path):
    now = [1000.0]
    ctx = context(tmp_path, lambda: now[0])
    taken = Intake(ctx)
    taken.begin(now[0])
    _unknown_output(taken, now, 21)  # the format is unknown so far...
    assert ctx.detector.watching_silence
    now[0] += 1.0
    taken.on_output(b"step 3/10 loss 2.31\n")  # ...and read a second later
    for _ in range(200):
        now[0] += 0.5
        taken.say_unknown_format(now[0])
    assert _said(taken) == []


def test_a_refusal_on_the_side_channel_leaves_the_console_watched_for_silence(tmp_path):
    """An integration that refuses says so on the side channel and falls back to the
    console: that console is still an unknown format to watch (only progress, an attached
    integration or trainctl's runner make the side channel the trainer's voice)."""
    now = [1000.0]
    ctx = context(tmp_path, lambda: now[0])
    taken = Intake(ctx)
    taken.begin(now[0])
    taken.on_side_line(
        E.encode(
            E.Info(now[0], "integration not attached: console parsing", "instrument.refused.ultralytics")
        ).encode()
    )
    _unknown_output(taken, now, 21)
    assert ctx.detector.watching_silence
    taken.on_side_line(
        E.encode(
            E.Info(now[0], "integration attached: ultralytics 8.4.190", "instrument.attached.ultralytics")
        ).encode()
    )
    assert not ctx.detector.watching_silence
