"""A plain PyTorch loop that loses minutes, not an epoch: it saves mid-epoch, honours
trainctl's save requests, and resumes inside an epoch.

    trainctl run --resume-arg=--resume --resume-arg={checkpoint} -- \\
        python examples/midepoch_resume.py --checkpoint-dir ckpts

What it takes from trainctl (trainctl.inside.report; outside trainctl every call does nothing):
- ``supports_save_on_request(save)``: declared once; trainctl then asks for a "planned" save
  before a restart it was told to do, and for a "rescue" save when the run stalls while the
  main thread can still run Python (a DataLoader worker deadlock: the main thread waits in
  ``_try_get_data``, inside ``data_wait``, and the save runs there at once);
- ``save_requested()`` at each batch end, for a request that came during a step;
- ``report_checkpoint(path, epoch, batch=, kind=)`` after each atomic save, and
  ``report_progress`` per batch.
Resume: the checkpoint holds the model, the optimizer, the sampler generator's state at the
epoch's start and the batches done in that epoch; the order of the epoch is drawn again from
that state, and the batches already done are skipped.

Test flags: ``--hang-at E:B`` (1-based) with ``--hang-kind`` worker (the DataLoader worker
loading that batch blocks forever), spin (the main thread spins in native code: a
catastrophic regex), worker-exit (that worker dies); ``--hang-attempt N``: only in attempt N
(TRAINCTL_ATTEMPT, or torchrun's TORCHELASTIC_RESTART_COUNT + 1); ``--resume auto``: the
newest save in the checkpoint directory (for launchers that restart with the same argv).  Prints ``resume epoch=E batch=B`` at start and one
``epoch=E/EE batch=B/BB loss=X`` per batch.  ``--nvrx-heartbeat``: send NVRx ft_launcher's
heartbeat per batch (bench/bench_incidents.py's comparison).  The lines there only for a tool
end with ``# trainctl`` or ``# nvrx`` (the bench counts them: docs/benchmarks.md, the rule).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from trainctl.inside import report  # trainctl

# trainctl's planned_wait_s: the kill comes well before
PLANNED_PAUSE_S = 60.0  # trainctl


class Synthetic(Dataset):
    def __init__(self, n: int, hang_index: int | None, hang_kind: str) -> None:
        self.n, self.hang_index, self.hang_kind = n, hang_index, hang_kind

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.hang_index:
            if self.hang_kind == "worker":
                threading.Event().wait()  # a worker deadlock: blocks forever
            elif self.hang_kind == "worker-exit":
                os._exit(9)  # a worker killed
        g = torch.Generator().manual_seed(i)
        x = torch.randn(16, generator=g)
        return x, x.sum().reshape(1)


def save(path: Path, state: dict) -> None:
    """Atomic: a temp file, fsync, rename."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--batch-time", type=float, default=0.05)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--save-every", type=int, default=20, help="periodic save every N batches (0: off)")
    p.add_argument("--checkpoint-dir", type=Path, default=Path("ckpts"))
    p.add_argument("--resume", type=Path, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stamp", action="store_true", help="end each line with t=<unix time> (benchmarks)")
    p.add_argument("--hang-at", default="")
    p.add_argument("--hang-kind", default="worker", choices=("worker", "spin", "worker-exit"))
    p.add_argument("--hang-attempt", type=int, default=0)
    p.add_argument("--nvrx-heartbeat", action="store_true", help="NVRx ft_launcher's heartbeat per batch")
    args = p.parse_args(argv)
    ft = None  # nvrx
    if args.nvrx_heartbeat:  # nvrx
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient  # nvrx

        ft = RankMonitorClient()  # nvrx
        ft.init_workload_monitoring()  # nvrx

    torch.manual_seed(args.seed)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(args.seed)
    epoch, done = 1, 0  # the epoch in progress (1-based) and its batches done
    epoch_gen_state = gen.get_state()
    if args.resume is not None and args.resume.name == "auto":  # the newest save (torchrun)
        saves = sorted(args.checkpoint_dir.glob("*.pt"), key=lambda f: f.stat().st_mtime)
        args.resume = saves[-1] if saves else None
    if args.resume is not None and args.resume.is_file():
        ck = torch.load(args.resume, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        epoch, done = ck["epoch"], ck["batch"]
        gen.set_state(ck["gen_state"])  # the epoch's order is drawn again from it
        epoch_gen_state = ck["gen_state"]
        if done >= args.batches:  # an epoch's end: draw its order to move on
            torch.randperm(args.batches * args.batch_size, generator=gen)
            epoch, done = epoch + 1, 0
            epoch_gen_state = gen.get_state()
    stamp = (lambda: f" t={time.time():.3f}") if args.stamp else (lambda: "")
    print(f"resume epoch={epoch} batch={done}{stamp()}", flush=True)
    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    pos = {"epoch": epoch, "batch": done, "gen_state": epoch_gen_state}

    def save_now(kind: str) -> None:
        path = args.checkpoint_dir / f"{kind}.pt"
        with report.saving():  # trainctl
            save(
                path,
                {
                    "model": model.state_dict(),
                    "opt": opt.state_dict(),
                    "epoch": pos["epoch"],
                    "batch": pos["batch"],
                    "gen_state": pos["gen_state"],
                },
            )
        report.report_checkpoint(path, pos["epoch"], batch=pos["batch"], kind=kind)  # trainctl
        print(f"checkpoint kind={kind} epoch={pos['epoch']} batch={pos['batch']}", flush=True)
        # trainctl restarts it now: take no batch it would redo
        if kind == "planned":  # trainctl
            time.sleep(PLANNED_PAUSE_S)  # trainctl

    report.supports_save_on_request(save=save_now)  # trainctl
    hang_e, _, hang_b = args.hang_at.partition(":")
    attempt = os.environ.get("TRAINCTL_ATTEMPT") or str(
        int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) + 1
    )
    hanging = bool(args.hang_at) and (not args.hang_attempt or attempt == str(args.hang_attempt))
    n = args.batches * args.batch_size
    while epoch <= args.epochs:
        if done == 0:
            pos["gen_state"] = gen.get_state()
        else:
            gen.set_state(pos["gen_state"])
        order = torch.randperm(n, generator=gen).tolist()
        hang_index = None
        if hanging and int(hang_e) == epoch and int(hang_b) > done:
            hang_index = order[(int(hang_b) - 1) * args.batch_size]
            if args.hang_kind == "spin":
                hang_index = None
        ds = Synthetic(n, hang_index, args.hang_kind)
        loader = DataLoader(
            ds,
            batch_size=args.batch_size,
            sampler=order[done * args.batch_size :],
            num_workers=args.workers,
            persistent_workers=False,
        )
        pos.update(epoch=epoch, batch=done)
        report.report_phase("train")  # trainctl
        try:
            # fmt: off
            done = run_epoch(
                args, epoch, done, loader, model, opt, pos, save_now, hanging, hang_e, hang_b, stamp,
                ft,  # nvrx
            )
            # fmt: on
        except RuntimeError:  # a DataLoader worker died: keep what is done
            save_now("rescue")
            raise
        save_now("epoch")  # position: all of this epoch done
        epoch, done = epoch + 1, 0
    report.report_phase("finished")  # trainctl
    if ft is not None:  # nvrx
        ft.shutdown_workload_monitoring()  # nvrx
    print("done", flush=True)
    return 0


# fmt: off
def run_epoch(
    args, epoch, done, loader, model, opt, pos, save_now, hanging, hang_e, hang_b, stamp,
    ft=None,  # nvrx
) -> int:
    # fmt: on
    for x, y in report.data_wait(loader):  # trainctl
        if hanging and args.hang_kind == "spin" and (epoch, done + 1) == (int(hang_e), int(hang_b)):
            re.match(r"(a+)+$", "a" * 64 + "b")  # native: no Python runs until it ends
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.batch_time)
        done += 1
        pos["batch"] = done
        print(
            f"epoch={epoch}/{args.epochs} batch={done}/{args.batches} loss={loss.item():.4f}{stamp()}",
            flush=True,
        )
        report.report_progress(epoch, args.epochs, done, args.batches, {"loss": loss.item()})  # trainctl
        if ft is not None:  # nvrx
            ft.send_heartbeat()  # nvrx
        kind = report.save_requested()  # trainctl
        if kind is not None:  # trainctl
            save_now(kind)  # trainctl
        elif args.save_every and done % args.save_every == 0 and done < args.batches:  # trainctl
            save_now("periodic")
    return done


if __name__ == "__main__":
    sys.exit(main())
