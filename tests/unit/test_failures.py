"""Issue 16 point 5: failures explained (the last exception line, the traceback's tail),
deterministic start-up errors in the catalog, "ETA unknown" once, [host] setup."""

from __future__ import annotations

import pytest

from trainctl.agent.attempt import with_setup
from trainctl.core import events as E
from trainctl.core.printer import Printer, format_event
from trainctl.core.recovery import Outcome, RecoveryPolicy
from trainctl.core.signatures import Catalog
from trainctl.core.tracebacks import last_exception

pytestmark = pytest.mark.timeout(10)

TB = [
    "epoch 0 starting",
    "Traceback (most recent call last):",
    '  File "/w/train.py", line 3, in <module>',
    "    import torch",
    "ModuleNotFoundError: No module named 'torch'",
]


def test_last_exception_and_its_traceback_tail():
    exc, tail = last_exception(TB)
    assert exc == "ModuleNotFoundError: No module named 'torch'"
    assert tail[0].startswith("Traceback") and tail[-1] == exc
    chained = [
        "Traceback (most recent call last):",
        '  File "a.py", line 1',
        "KeyError: 'x'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "a.py", line 4',
        *[f"    frame {i}" for i in range(9)],
        "[rank0]: torch.distributed.DistBackendError: NCCL error in: x",
    ]
    exc, tail = last_exception(chained)
    assert exc == "torch.distributed.DistBackendError: NCCL error in: x" and len(tail) == 6
    assert last_exception(["t.py: error: unrecognized arguments: --epoch 5"])[0].startswith("t.py: error")
    assert last_exception(["epoch 1 loss 0.3", "done"]) == (None, ())


def test_exit_event_round_trips_and_prints_the_tail():
    ev = E.Exit(0.0, 1, None, TB[-1], tuple(TB[1:]))
    back = E.decode(E.encode(ev))
    assert back == ev
    text = format_event(ev)
    assert "EXIT   returncode 1: ModuleNotFoundError: No module named 'torch'" in text
    assert "| Traceback (most recent call last):" in text and "|     import torch" in text


def test_the_failed_reason_names_the_exception():
    policy = RecoveryPolicy(None, None)
    d = policy.decide(Outcome("crash", False, 1, stop_reason="py.import_error: x", exception=TB[-1]))
    assert (
        d.action == "fail" and "exited with code 1 (ModuleNotFoundError: No module named 'torch')" in d.reason
    )


@pytest.mark.parametrize(
    "line,sig",
    [
        ("ModuleNotFoundError: No module named 'torch'", "py.import_error"),
        ("ImportError: cannot import name 'x' from 'y' (/y/__init__.py)", "py.import_error"),
        ("SyntaxError: invalid syntax", "py.syntax_error"),
        ("python3: can't open file '/w/train.py': [Errno 2] No such file or directory", "py.script_missing"),
        ("FileNotFoundError: [Errno 2] No such file or directory: 'data.yaml'", "py.script_missing"),
        ("train.py: error: the following arguments are required: --data", "py.usage_error"),
        ("RuntimeError: No CUDA GPUs are available", "rt.no_device"),
        ("RuntimeError: HIP error: no ROCm-capable device is detected", "rt.no_device"),
    ],
)
def test_start_up_errors_are_fatal_stops_before_the_first_batch_only(line, sig):
    cat = Catalog.load()
    got = cat.match(line)
    assert got is not None and got.id == sig
    assert got.action == "stop" and got.severity == "fatal" and got.before_progress


def test_eta_unknown_is_said_once_until_an_eta_was_known():
    p = Printer()
    unknown = E.Projection(0.0, None, None, None, None, None, None)
    known = E.Projection(30.0, 1000.0, None, None, 2.0, None, None)
    lines = [p.format(ev) for ev in (unknown, unknown, unknown, known, unknown, unknown)]
    assert [bool(x) for x in lines] == [True, False, False, True, True, False]
    assert "ETA    unknown" in lines[0]


def test_setup_runs_before_the_trainer_which_keeps_its_argv():
    assert with_setup(["python", "t.py"], "") == ["python", "t.py"]
    argv = with_setup(["python", "t.py"], "source ~/venv/bin/activate")
    assert argv[1] == "-c" and argv[2].startswith("source ~/venv/bin/activate\n")
    assert argv[2].endswith('exec "$@"') and argv[-2:] == ["python", "t.py"]
