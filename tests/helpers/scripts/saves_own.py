"""A plain PyTorch script that knows nothing of trainctl: its own argparse ``--resume``,
its own ``torch.save`` every ``--save-every`` steps, a DataLoader with 2 forked workers.

    python saves_own.py --steps 12 --save-every 5 [--folders] [--resume PATH]
                        [--hang ATTEMPT:STEP ...] [--step-time 0.05]
                        [--workers 2] [--prints keyvalue|imagenet|nanogpt] [--init-from resume]

Saves ``out/ckpt.pt`` (``{"step", "model", "opt", "args"}``, overwritten in place), or with
``--folders`` ``out/checkpoint-<step>/{model.pt,optim.pt}``.  ``--hang A:S``: in attempt A
(``TRAINCTL_ATTEMPT``) the worker that loads step S's batch blocks for good, a deadlock the
main process waits on.  Prints ``epoch=1/1 batch=S/N loss=X`` per step and
``resumed from PATH at step S`` / ``started from scratch``.

Two public families' ways, as their sources have them (bench/real_scripts.toml runs the
scripts themselves): ``--prints imagenet`` prints pytorch/examples imagenet's
``Epoch: [0][ 3/12]\tLoss 1.2300e+00 (1.3100e+00)`` (its AverageMeter: the value, the
running average in parentheses); ``--prints nanogpt`` nanoGPT's ``iter 3: loss 1.2300, time
5.00ms, mfu -100.00%``, and ``--init-from resume`` resumes as nanoGPT does, reading
``out/ckpt.pt`` itself (a flag with no path).  ``--workers 0``: no DataLoader worker; the
step that hangs then blocks the main process."""

import argparse
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset

BATCH = 4


class Steps(Dataset):
    def __init__(self, first: int, steps: int, hang_step: int | None, step_time: float) -> None:
        self.first, self.steps, self.hang, self.step_time = first, steps, hang_step, step_time

    def __len__(self) -> int:
        return (self.steps - self.first) * BATCH

    def __getitem__(self, i: int):
        step = self.first + i // BATCH + 1
        if step == self.hang:
            time.sleep(3600)  # this worker (or, with no workers, the main process) blocks for good
        time.sleep(self.step_time / BATCH)
        g = torch.Generator().manual_seed(step * 100 + i % BATCH)
        x = torch.randn(4, generator=g)
        return x, x.sum(0, keepdim=True)


def save(args, step: int, model, opt) -> None:
    os.makedirs("out", exist_ok=True)
    if args.folders:
        d = f"out/checkpoint-{step}"
        os.makedirs(d, exist_ok=True)
        torch.save({"step": step, "model": model.state_dict()}, f"{d}/model.pt")
        torch.save({"opt": opt.state_dict()}, f"{d}/optim.pt")
    else:
        torch.save(
            {"step": step, "model": model.state_dict(), "opt": opt.state_dict(), "args": args}, "out/ckpt.pt"
        )


def progress_line(prints: str, step: int, steps: int, loss: float) -> str:
    if prints == "imagenet":  # ProgressMeter: '\t'.join of "Epoch: [0]" + "[ i/N]" and the meters
        i, n = step - 1, steps
        return (
            f"Epoch: [0][{i:>{len(str(n))}d}/{n}]\tTime  0.050 ( 0.051)\tLoss {loss:.4e} ({loss * 1.1:.4e})"
        )
    if prints == "nanogpt":
        return f"iter {step}: loss {loss:.4f}, time 5.00ms, mfu -100.00%"
    return f"epoch=1/1 batch={step}/{steps} loss={loss:.4f}"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--folders", action="store_true")
    p.add_argument("--resume")
    p.add_argument("--hang", action="append", default=[])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--prints", choices=("keyvalue", "imagenet", "nanogpt"), default="keyvalue")
    p.add_argument("--init-from", choices=("scratch", "resume"), default="scratch")
    args = p.parse_args()
    if args.init_from == "resume":
        args.resume = "out/ckpt.pt"
    attempt = os.environ.get("TRAINCTL_ATTEMPT", "1")
    hang = next((int(h.split(":")[1]) for h in args.hang if h.split(":")[0] == attempt), None)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    first = 0
    if args.resume:
        if args.folders:
            state = torch.load(f"{args.resume}/model.pt")
            opt.load_state_dict(torch.load(f"{args.resume}/optim.pt")["opt"])
        else:
            state = torch.load(args.resume, weights_only=False)
            opt.load_state_dict(state["opt"])
        model.load_state_dict(state["model"])
        first = state["step"]
        print(f"resumed from {args.resume} at step {first}", flush=True)
    else:
        print("started from scratch", flush=True)
    loader = DataLoader(
        Steps(first, args.steps, hang, args.step_time),
        batch_size=BATCH,
        num_workers=args.workers,
        multiprocessing_context="fork" if args.workers else None,
    )
    for i, (xb, yb) in enumerate(loader):
        step = first + i + 1
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(progress_line(args.prints, step, args.steps, loss.item()), flush=True)
        if step % args.save_every == 0:
            save(args, step, model, opt)
    print("done", flush=True)


if __name__ == "__main__":
    main()
