"""Record a plain PyTorch training with a real hang and one restart as an events journal.

    .venv/bin/python tests/data/runs/record_torch.py [OUT.jsonl]

The child trains a small CNN for 6 epochs from a DataLoader with 2 worker processes and
saves an epoch checkpoint after each epoch's validation.  In attempt 1 the workers block
forever on an Event (the seeds' hang) at about half the work; the parent notices that the
journal stopped growing, writes stall/exit/restart/start like the agent would, kills the
process group and resumes from the last epoch checkpoint.  Progress is throttled like the
agent's journal (every 0.25 s plus each epoch's first and last batch).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
EPOCHS = 6
HANG_AT = (4, 30)  # attempt 1 hangs after this (epoch, batch): ~56 % of the work
STALL_S = 4.0  # the parent's stall threshold


def child(out: Path, work: Path, resume: bool, hang: bool) -> None:
    import threading

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    from trainctl.core import events as E
    from trainctl.store.journal import ProgressThrottle

    torch.set_num_threads(1)
    fd = os.open(out, os.O_WRONLY | os.O_APPEND)
    flag = work / "hang.flag"

    def emit(ev: E.Event | None) -> None:
        if ev is not None:
            os.write(fd, (E.encode(ev) + "\n").encode())

    class Shapes(Dataset):
        """Synthetic 3x32x32 images; 'decoding' takes a few ms, as reading JPEGs would."""

        def __init__(self, n: int, seed: int):
            self.n, self.seed = n, seed

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, i: int):
            if flag.exists():
                threading.Event().wait()  # a worker that never delivers its batch
            g = torch.Generator().manual_seed(self.seed + i)
            x = torch.rand(3, 32, 32, generator=g)
            time.sleep(0.025)
            return x, int(x.mean() * 10) % 4

    def loader(n: int, seed: int, shuffle: bool) -> DataLoader:
        return DataLoader(
            Shapes(n, seed),
            batch_size=8,
            shuffle=shuffle,
            num_workers=2,
            multiprocessing_context="fork",
            persistent_workers=False,
        )

    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 4),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ckpt = work / "last.pt"
    start_epoch = 1
    if resume and ckpt.exists():
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start_epoch = state["epoch"] + 1
    train_dl, val_dl = loader(640, 0, True), loader(96, 10_000, False)
    throttle = ProgressThrottle(0.25)
    for epoch in range(start_epoch, EPOCHS + 1):
        emit(E.Phase(time.time(), "train"))
        model.train()
        for b, (x, y) in enumerate(train_dl, 1):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            emit(
                throttle.offer(
                    E.Progress(time.time(), epoch, EPOCHS, b, len(train_dl), {"loss": round(loss.item(), 4)})
                )
            )
            if hang and (epoch, b) == HANG_AT:
                flag.touch()
        emit(throttle.flush(time.time(), force=True))
        emit(E.Phase(time.time(), "val"))
        model.eval()
        with torch.no_grad():
            for x, y in val_dl:
                model(x)
        emit(E.Phase(time.time(), "save"))
        torch.save({"epoch": epoch, "model": model.state_dict(), "opt": opt.state_dict()}, ckpt)
        emit(E.Checkpoint(time.time(), str(ckpt), epoch))
    emit(E.Phase(time.time(), "finished"))


def _finished(out: Path) -> bool:
    """The child said it finished (it may take a while to exit after that)."""
    with open(out, "rb") as f:
        f.seek(max(0, out.stat().st_size - 200))
        return b'"phase":"finished"' in f.read()


def main() -> int:
    from trainctl.core import events as E

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "torch_restart.jsonl"
    out.write_text("")

    def write(ev: E.Event) -> None:
        with open(out, "a") as f:
            f.write(E.encode(ev) + "\n")

    with tempfile.TemporaryDirectory(prefix="rec-torch-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        for attempt in (1, 2):
            cmd = [
                sys.executable,
                __file__,
                "--child",
                str(out),
                str(work),
                "resume" if attempt > 1 else "fresh",
                "hang" if attempt == 1 else "ok",
            ]
            proc = subprocess.Popen(cmd, env=env, start_new_session=True)
            write(E.Start(time.time(), attempt, proc.pid, "A", ("python", "train.py")))
            start_size = last_size = out.stat().st_size
            last_change = time.time()
            try:
                while proc.poll() is None:
                    time.sleep(0.1)
                    size = out.stat().st_size
                    if size != last_size:
                        last_size, last_change = size, time.time()
                    elif size > start_size and time.time() - last_change > STALL_S and not _finished(out):
                        now = time.time()
                        write(E.Stall(now, "train", now - last_change, "deadlock"))
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                        write(E.Exit(time.time(), proc.returncode, "SIGKILL"))
                        write(E.Restart(time.time(), attempt + 1, "stall", "A", str(work / "last.pt")))
                        (work / "hang.flag").unlink(missing_ok=True)
                        break
                else:
                    write(E.Exit(time.time(), proc.returncode))
                    return 0 if proc.returncode == 0 else 1
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    return 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] == "resume", sys.argv[5] == "hang")
    else:
        sys.exit(main())
