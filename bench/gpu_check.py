"""The GPU path on a real GPU (issue 43): one prepared script of at most 8 minutes for a box
with an NVIDIA GPU, PyTorch with CUDA and nvidia-ml-py.

    python bench/gpu_check.py --out DIR [--wheels WHEELDIR] [--device 0] [--budget 480]

trainctl and its other dependencies are installed from ``--wheels`` (``pip install
--no-index --find-links WHEELDIR trainctl``) when given, else taken from this checkout's
``src/`` when they import; a step that needs them is skipped, saying so, when they do not.
Each step runs ``trainctl run --json --no-tmux`` (headless) on a small CUDA trainer this
script writes to ``DIR``, and reads its events and the driver (NVML) itself:

1. ``train``: a CUDA training; its journal names the run's GPU by the trainer's pid.
2. ``worker-stop``: a DataLoader worker stopped (SIGSTOP) mid-epoch → stall → kill → the
   memory wait sees the device memory released (NVML polled here every 0.1 s: the wait's
   end within 2 s of the release) → the restart resumes from the checkpoint.  Also the
   warm spare: parked with no CUDA context (NVML lists no process for its pid), then
   released, training on the GPU.
3. ``busy-other``: an unrelated CUDA process keeps the device busy while the trainer hangs
   before its first batch: the stall is still said within the start-up window.
4. ``py-spy``: ``py-spy dump`` of a trainer blocked in ``torch.cuda.synchronize``.
5. ``health``: the health check of a device before a restart (issue 43 item 5): not built
   yet, reported as skipped.

Without a GPU the steps run on the CPU where they mean something there (1 and 2: the
stall, the kill, the resume; no memory wait), and the rest is skipped with the reason.
Results: ``DIR/results.json`` and ``DIR/results.md`` (for docs/benchmarks.md "On a GPU").
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TRAINER = r"""
import argparse, os, signal, sys, threading, time
import torch

p = argparse.ArgumentParser()
p.add_argument("--mode", default="train")  # train | worker-stop | deadlock | sync-hang
p.add_argument("--batches", type=int, default=30)
p.add_argument("--hang-at", type=int, default=12)
p.add_argument("--mib", type=int, default=1024)
p.add_argument("--checkpoint-dir", default="ckpts")
p.add_argument("--resume", default=None)
a = p.parse_args()
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
first = os.environ.get("TRAINCTL_ATTEMPT", "1") == "1"


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return a.batches * 8

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        if a.mode == "worker-stop" and first and info is not None and i == a.hang_at * 8:
            os.kill(os.getpid(), signal.SIGSTOP)  # a DataLoader worker stopped mid-epoch
        time.sleep(0.01)
        return torch.randn(256), torch.randn(1)


model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ballast = torch.empty(a.mib << 20, dtype=torch.uint8, device=dev) if dev.type == "cuda" else None
done = 0
if a.resume and os.path.isfile(a.resume):
    ck = torch.load(a.resume, weights_only=False)
    model.load_state_dict(ck["model"])
    done = ck["batch"]
print(f"resume batch={done} device={dev}", flush=True)
if a.mode == "deadlock":
    print("loading the model", flush=True)
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()
if a.mode == "sync-hang":
    torch.cuda._sleep(1 << 42)  # one kernel that spins for a very long time
    print("synchronizing", flush=True)
    torch.cuda.synchronize()
os.makedirs(a.checkpoint_dir, exist_ok=True)
loader = torch.utils.data.DataLoader(Data(), batch_size=8, num_workers=2)
for b, (x, y) in enumerate(loader, start=1):
    if b <= done:
        continue
    loss = torch.nn.functional.mse_loss(model(x.to(dev)), y.to(dev))
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"epoch=1/1 batch={b}/{a.batches} loss={loss.item():.4f}", flush=True)
    if b % 5 == 0:
        tmp = os.path.join(a.checkpoint_dir, "last.tmp")
        torch.save({"model": model.state_dict(), "batch": b}, tmp)
        os.replace(tmp, os.path.join(a.checkpoint_dir, "last.pt"))
"""

OTHER = r"""
import sys, torch
x = torch.ones(1, device="cuda")
print("busy", flush=True)
while True:
    torch.cuda._sleep(1 << 30)
    torch.cuda.synchronize()
"""


class Check:
    def __init__(self, out: Path, budget: float) -> None:
        self.out = out
        self.t0 = time.monotonic()
        self.budget = budget
        self.steps: list[dict] = []
        self.facts: dict = {}

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def record(self, name: str, status: str, detail: str, **figures) -> None:
        self.steps.append({"step": name, "status": status, "detail": detail, **figures})
        print(f"[{status:>7}] {name}: {detail}", flush=True)

    def write(self) -> int:
        failed = [s for s in self.steps if s["status"] == "FAILED"]
        data = {**self.facts, "steps": self.steps, "seconds": round(time.monotonic() - self.t0, 1)}
        (self.out / "results.json").write_text(json.dumps(data, indent=2))
        lines = [
            f"# gpu_check {self.facts.get('date')}: {self.facts.get('gpu') or 'no GPU'}",
            "",
            "| step | status | detail |",
            "|---|---|---|",
        ]
        lines += [f"| {s['step']} | {s['status']} | {s['detail']} |" for s in self.steps]
        (self.out / "results.md").write_text("\n".join(lines) + "\n")
        return 1 if failed else 0


def nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception as e:  # noqa: BLE001 - any NVML failure: no GPU for this check
        print(f"no NVML: {type(e).__name__}: {e}", flush=True)
        return None


def compute_pids(nv, index: int) -> dict[int, int]:
    h = nv.nvmlDeviceGetHandleByIndex(index)
    return {p.pid: int(p.usedGpuMemory or 0) for p in nv.nvmlDeviceGetComputeRunningProcesses(h)}


def trainctl_env(args) -> tuple[dict[str, str] | None, str]:
    """The environment trainctl runs in, or None and why not."""
    env = dict(os.environ)
    if args.wheels:
        r = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", args.wheels, "trainctl"],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            return None, f"pip install from {args.wheels} failed: {r.stderr.strip().splitlines()[-1:]}"
    probe = [sys.executable, "-c", "import trainctl.cli.main, psutil"]
    if subprocess.run(probe, env=env, capture_output=True).returncode != 0:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
        r = subprocess.run(probe, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            tail = (r.stderr.strip().splitlines() or ["?"])[-1]
            return None, f"trainctl does not import ({tail}); give --wheels"
    return env, "ok"


def run_trainctl(env, out: Path, name: str, options: list[str], trainer: list[str], timeout: float):
    """(events, run directory, stdout path) of one headless run."""
    run_dir = out / name
    shutil.rmtree(run_dir, ignore_errors=True)
    argv = [sys.executable, "-m", "trainctl", "run", "--json", "--no-tmux", "--run-dir", str(run_dir)]
    argv += [*options, "--", sys.executable, str(out / "trainer.py"), *trainer]
    log = out / f"{name}.jsonl"
    with open(log, "w") as f:
        try:
            subprocess.run(argv, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, cwd=out)
        except subprocess.TimeoutExpired:
            pass
    events = []
    for line in log.read_text().splitlines():
        with contextlib.suppress(ValueError):
            ev = json.loads(line)
            if isinstance(ev, dict) and "type" in ev:
                events.append(ev)
    return events, run_dir


def of(events, kind: str, key: str | None = None) -> list[dict]:
    return [e for e in events if e.get("type") == kind and (key is None or e.get("key") == key)]


def step_train(c: Check, env, nv, device: int) -> None:
    seen: dict[int, int] = {}
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set() and nv is not None:
            with contextlib.suppress(Exception):
                seen.update(compute_pids(nv, device))
            time.sleep(0.2)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    events, _ = run_trainctl(env, c.out, "train", [], ["--batches", "30"], min(90, c.left()))
    stop.set()
    starts = of(events, "start")
    said = [e["text"] for e in of(events, "info", "gpu_devices")]
    ok = bool(of(events, "exit")) and of(events, "exit")[-1].get("returncode") == 0
    if nv is None:
        c.record("train", "passed" if ok else "FAILED", f"CPU training under trainctl finished: {ok}")
        return
    pid = starts[0].get("pid") if starts else None
    mine = [s for s in said if "(by pids:" in s and re.match(rf"the run's GPUs: {device} \(", s)]
    detail = f"journal: {said[-1] if said else 'no gpu_devices line'}; NVML saw pids {sorted(seen)}"
    c.record("train", "passed" if ok and mine and (pid is None or pid in seen) else "FAILED", detail)


def step_worker_stop(c: Check, env, nv, device: int) -> None:
    ckpt = c.out / "ckpts-stop"
    shutil.rmtree(ckpt, ignore_errors=True)
    gone_at: dict[int, float] = {}
    first_pids: set[int] = set()
    first_seen: dict[int, float] = {}  # every pid NVML listed on the device, when first
    stop = threading.Event()

    def poll() -> None:  # when the first attempt's processes leave the device's list
        while not stop.is_set():
            with contextlib.suppress(Exception):
                now_pids = set(compute_pids(nv, device))
                for pid in now_pids:
                    first_seen.setdefault(pid, time.time())
                first_pids.update(now_pids if not gone_at else ())
                for pid in first_pids - now_pids:
                    gone_at.setdefault(pid, time.time())
            time.sleep(0.1)

    if nv is not None:
        threading.Thread(target=poll, daemon=True).start()
    options = ["--stall-timeout", "8", "--max-restarts", "1"]
    options += ["--resume-arg=--resume", "--resume-arg={checkpoint}"]
    trainer = ["--mode", "worker-stop", "--batches", "40", "--hang-at", "12", "--checkpoint-dir", str(ckpt)]
    events, _ = run_trainctl(env, c.out, "worker-stop", options, trainer, min(180, c.left()))
    stop.set()
    stall, restart = of(events, "stall"), of(events, "restart")
    starts, waits = of(events, "start"), [e["text"] for e in of(events, "info", "gpu_release")]
    exits = of(events, "exit")
    resumed = bool(restart) and bool(restart[0].get("resume_from"))
    ok = len(stall) == 1 and resumed and bool(exits) and exits[-1].get("returncode") == 0
    detail = f"stall {len(stall)}, restart resumed from {restart[0].get('resume_from') if restart else None}"
    figures: dict = {}
    wait_events = of(events, "info", "gpu_release")
    if nv is not None and gone_at:
        released = max(gone_at.values())
        if wait_events:  # the wait's end, journaled, against the release NVML showed here
            figures["wait_end_after_release_s"] = round(wait_events[0]["ts"] - released, 2)
            ok = ok and figures["wait_end_after_release_s"] <= 2.0
            detail += f"; the wait ended {figures['wait_end_after_release_s']} s after the release: {waits}"
        else:  # released before the wait's first reading: no wait, nothing journaled
            detail += "; no wait (released before the first reading)"
    elif nv is not None:
        ok = False
        detail += "; the release was not seen"
    c.record("worker-stop", "passed" if ok else "FAILED", detail, **figures)
    parked = [
        e["text"] for e in events if e.get("type") == "info" and "warm spare parked" in e.get("text", "")
    ]
    if not parked:
        c.record("spare", "skipped", "no warm spare parked in this run (the run's spare rule)")
        return
    m = re.search(r"\(pid (\d+)\)", parked[0])
    spare_pid = int(m.group(1)) if m else None
    no_context = "no GPU context" in parked[0]
    if nv is None:
        c.record("spare", "passed" if no_context else "FAILED", parked[0])
        return
    # parked: NVML lists no process for it; released (the next attempt's trainer): on the GPU
    released = next((e for e in starts[1:] if e.get("pid") == spare_pid), None)
    seen = first_seen.get(spare_pid) if spare_pid is not None else None
    parked_clean = seen is None or (released is not None and seen >= released["ts"] - 0.5)
    ok = no_context and parked_clean and (released is None or seen is not None)
    c.record(
        "spare",
        "passed" if ok else "FAILED",
        f"{parked[0]}; on the GPU while parked: {not parked_clean}; released as the next trainer: "
        f"{released is not None}, then on the GPU: {seen is not None}",
    )


def step_busy_other(c: Check, env, nv, device: int) -> None:
    if nv is None:
        c.record("busy-other", "skipped", "needs a GPU: another process's CUDA work on the run's device")
        return
    (c.out / "other.py").write_text(OTHER)
    other = subprocess.Popen(
        [sys.executable, str(c.out / "other.py")],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": str(device)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        other.stdout.readline()  # "busy": its kernels run
        t0 = time.time()
        events, _ = run_trainctl(
            env,
            c.out,
            "busy-other",
            ["--max-restarts", "0", "--startup-idle", "10"],
            ["--mode", "deadlock"],
            min(90, c.left()),
        )
    finally:
        other.kill()
        other.wait()
    stall = of(events, "stall")
    late = stall[0]["ts"] - t0 if stall else None
    ok = bool(stall) and stall[0].get("phase") == "startup"
    c.record(
        "busy-other",
        "passed" if ok else "FAILED",
        f"stall in startup {late and round(late, 1)} s after start",
    )


def step_pyspy(c: Check, env, nv) -> None:
    if nv is None:
        c.record("py-spy", "skipped", "needs a GPU: a trainer blocked in torch.cuda.synchronize")
        return
    if shutil.which("py-spy") is None:
        c.record("py-spy", "skipped", "py-spy not on PATH")
        return
    proc = subprocess.Popen(
        [sys.executable, str(c.out / "trainer.py"), "--mode", "sync-hang"], stdout=subprocess.PIPE, text=True
    )
    try:
        while (line := proc.stdout.readline()) and "synchronizing" not in line:
            pass
        time.sleep(1.0)
        r = subprocess.run(
            ["py-spy", "dump", "--pid", str(proc.pid)], capture_output=True, text=True, timeout=30
        )
    finally:
        proc.kill()
        proc.wait()
    (c.out / "py-spy-sync.txt").write_text(r.stdout + r.stderr)
    ok = "synchronize" in r.stdout
    c.record("py-spy", "passed" if ok else "FAILED", f"dump names synchronize: {ok}")


def step_health(c: Check, nv, device: int) -> None:
    """The pre-restart health check (src/trainctl/system/gpu_health.py, stdlib only: loaded
    from its file) on the device: a good one passes, within its bound."""
    if nv is None:
        c.record("health", "skipped", "needs a GPU: the check runs on CUDA/ROCm devices only")
        return
    import importlib.util

    where = ROOT / "src" / "trainctl" / "system" / "gpu_health.py"
    spec = importlib.util.spec_from_file_location("gpu_health", where)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    health = module.check(sys.executable, [device])
    ok = health.passed == (device,) and not health.failed
    c.record("health", "passed" if ok else "FAILED", health.said(), seconds=round(health.seconds, 1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--wheels", default=None)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--budget", type=float, default=480.0)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    c = Check(args.out, args.budget)
    c.facts["date"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    try:
        import torch

        cuda = torch.cuda.is_available()
        c.facts["torch"] = torch.__version__
    except ImportError:
        c.record("setup", "FAILED", "PyTorch does not import")
        return c.write()
    nv = nvml() if cuda else None
    if nv is not None:
        name = nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(args.device))
        c.facts["gpu"] = name.decode() if isinstance(name, bytes) else name
    c.record("setup", "passed", f"torch {torch.__version__}, CUDA {cuda}, GPU {c.facts.get('gpu')}")
    step_health(c, nv, args.device)  # stdlib only: runs without trainctl's dependencies
    env, why = trainctl_env(args)
    if env is None:
        for name in ("train", "worker-stop", "spare", "busy-other", "py-spy"):
            c.record(name, "skipped", why)
        return c.write()
    if nv is not None:  # the trainer and the other process see the device asked for
        env["CUDA_VISIBLE_DEVICES"] = str(args.device)
    (args.out / "trainer.py").write_text(TRAINER)
    step_train(c, env, nv, args.device)
    step_worker_stop(c, env, nv, args.device)
    step_busy_other(c, env, nv, args.device)
    step_pyspy(c, env, nv)
    return c.write()


if __name__ == "__main__":
    sys.exit(main())
