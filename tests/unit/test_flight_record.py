"""The ranks' Flight Recorder: reading their answers (a real gloo recording and NCCL-shaped
ones), the launch environment, and the request through each rank's FIFO."""

from __future__ import annotations

import importlib.util
import json
import os
import threading
from pathlib import Path

from trainctl.agent import flight
from trainctl.core import flight_record
from trainctl.core.flight_record import Unfinished
from trainctl.inside import BOOTSTRAP_DIR, FLIGHT_DIR_ENV

DATA = Path(__file__).resolve().parents[1] / "data" / "flight"


def _recorded(name: str) -> dict[int, dict]:
    return {
        int(p.stem[len("rank") :]): json.loads(p.read_text())
        for p in sorted((DATA / name).glob("rank*.json"))
    }


def test_a_rank_that_skipped_an_all_reduce_is_named_from_the_real_gloo_recording():
    found = flight_record.unfinished(_recorded("gloo_skip"))
    assert found == (Unfinished("default_pg", 6, "gloo:all_reduce", "scheduled", (0,), (1,)),)
    said = flight_record.said(tuple(c.as_dict() for c in found), {})
    assert said == (
        "Flight Recorder: gloo:all_reduce #6 of default_pg did not complete: rank 1 never "
        "entered it; rank 0 waits in it (scheduled)."
    )


def _nccl(rank: int, entries: list[tuple[int, str, bool]], ranks: str = "[0, 1, 2]") -> dict:
    return {
        "rank": rank,
        "fr": None,
        "nccl": {
            "entries": [
                {
                    "collective_seq_id": seq,
                    "profiling_name": "nccl:all_reduce",
                    "process_group": ["0", "default_pg"],
                    "state": state,
                    "retired": retired,
                }
                for seq, state, retired in entries
            ],
            "pg_config": {"0": {"desc": "default_pg", "ranks": ranks}},
            "pg_status": {"0": {"last_enqueued_collective": str(max(e[0] for e in entries))}},
        },
    }


def test_every_rank_in_a_collective_that_never_completes_names_no_missing_rank():
    answers = {r: _nccl(r, [(1, "completed", True), (2, "started", False)]) for r in (0, 1, 2)}
    (found,) = flight_record.unfinished(answers)
    assert (found.seq, found.state, found.entered, found.missing) == (2, "started", (0, 1, 2), ())


def test_the_lowest_unfinished_collective_decides_and_a_silent_rank_is_no_culprit():
    answers = {
        0: _nccl(0, [(1, "completed", False), (2, "scheduled", False), (3, "scheduled", False)]),
        1: _nccl(1, [(1, "completed", True)]),
    }  # rank 2 of the group gave no answer
    (found,) = flight_record.unfinished(answers)
    assert (found.seq, found.entered, found.missing) == (2, (0,), (1,))
    said = flight_record.said((found.as_dict(),), {2: "not listening"})
    assert said.endswith("rank 2 gave no record (not listening).")
    assert flight_record.unfinished({0: _nccl(0, [(1, "completed", True)])}) == ()


def test_the_launch_env_turns_the_recorder_on_and_keeps_the_users_values(tmp_path):
    env = flight.launch_env({"PATH": "/bin"}, tmp_path)
    where = tmp_path / flight.FLIGHT_DIR
    assert where.is_dir() and env[FLIGHT_DIR_ENV] == str(where)
    assert env["TORCH_FR_BUFFER_SIZE"] == flight.BUFFER_ENTRIES
    assert (
        env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == env["TORCH_FR_DUMP_TEMP_FILE"] == str(where / "nccl-rank")
    )
    users = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/scratch/fr_"}
    env = flight.launch_env(users, tmp_path)
    assert "TORCH_FR_BUFFER_SIZE" not in env and "TORCH_FR_DUMP_TEMP_FILE" not in env
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "50"
    assert flight.launch_env({"TORCH_FR_BUFFER_SIZE": "0"}, tmp_path)["TORCH_FR_BUFFER_SIZE"] == "0"


def _bootstrap_flight():
    spec = importlib.util.spec_from_file_location("trainctl_flight", BOOTSTRAP_DIR / "trainctl_flight.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_rank_answers_through_its_fifo_and_a_rank_not_listening_is_said(tmp_path):
    responder = _bootstrap_flight()
    directory = tmp_path / flight.FLIGHT_DIR
    directory.mkdir()
    responder.start(str(directory), 0)  # a rank's thread, here in this process
    os.mkfifo(directory / "rank1.fifo")  # a rank gone: its FIFO has no reader
    answers, missed = flight.ask(directory, wait_s=5.0)
    assert set(answers) == {0} and answers[0]["pid"] == os.getpid(), answers
    assert answers[0]["request"].startswith("stall-")
    assert missed == {1: "not listening"}
    assert (directory / "rank0.json").stat().st_mode & 0o077 == 0
    # a second request gets a fresh answer, not the first one's file
    again, _ = flight.ask(directory, wait_s=5.0)
    assert again[0]["request"] != answers[0]["request"]
    assert any(t.name == "trainctl-flight" and t.daemon for t in threading.enumerate())


def test_no_flight_directory_asks_nothing(tmp_path):
    assert flight.verdict(tmp_path, wait_s=0.1) == ((), "")
