"""Week-long runs (issue 20): `status`, attach-to-state and memory on a ten-day journal.

    .venv/bin/python bench/bench_long_run.py [--days 10] [--from JOURNAL] [--no-ssh]

Builds a journal of ``--days`` days at one progress event a second (864,000 for ten days:
50 epochs of 41,163 batches at 2.4 it/s, a projection every 30 s, a warning an hour, a
stall and a restart a day) from the events of a recorded run (``--from``; by default
tests/data/journals/demo_run.jsonl, a real `trainctl demo --json` run), written through
the project's own writer (``Journal.append``).  Then prints, each measured in a fresh
process (its peak RSS is the client's memory):

* the journal's size per day;
* `trainctl status` with no agent: before (the whole journal read, as trainctl did before
  snapshots), the first one (it indexes the journal: folds it once and writes
  snapshot.json) and the next ones (snapshot + the journal's tail);
* with a real agent going on with that journal (`trainctl agent`, a trainer that prints a
  batch every 0.5 s): the agent's own indexing time and RSS, `trainctl status`, and the
  dashboard's attach-to-state time (the real app, headless: from its start to the run's
  state and last event on screen) over the Unix socket and over ssh (the loopback sshd of
  tests/helpers/sshd.py, `trainctl bridge` on the far side): before (a full replay, what
  the bridge asked before) and after (a snapshot, then the events after it).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainctl.core import events as E  # noqa: E402
from trainctl.store.journal import Journal  # noqa: E402

DEMO = ROOT / "tests" / "data" / "journals" / "demo_run.jsonl"
HANDMADE = ROOT / "tests" / "data" / "journals" / "handmade_run.jsonl"
TRAINCTL = [sys.executable, "-m", "trainctl"]
BATCHES, EPOCHS, RATE = 41163, 50, 2.4
TRAINER = (
    "import time\nfor i in range(1, 10**6):\n"
    "    print(f'Epoch 50/50 {i}/41163 box_loss=0.9 cls_loss=0.8 dfl_loss=1.1', flush=True)\n"
    "    time.sleep(0.5)\n"
)


# ---------------------------------------------------------------------- building the journal
def templates(path: Path) -> dict[str, list[E.Event]]:
    out: dict[str, list[E.Event]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            ev = E.decode(line)
            out.setdefault(ev.type, []).append(ev)
    return out


def build(run_dir: Path, days: float, source: Path) -> tuple[int, float, int]:
    """Write the journal; returns (events, seconds, the bytes the same events take in the
    full form that journals had before compact progress lines)."""
    t = templates(source)
    progress = [p for p in t["progress"] if p.losses] or [E.Progress(0, 1, 1, 1, 1, {"loss": 1.0})]
    projection = (t.get("projection") or [E.Projection(0, None, None, None, RATE, None, None)])[0]
    warnings = t.get("warning") or [E.Warning(0, "trainctl.example", "warning", "an example")]
    run_dir.mkdir(parents=True, exist_ok=True)
    journal = Journal(run_dir / "events.jsonl")
    t0, seconds = 1.76e9, int(days * 86400)
    started = time.perf_counter()
    n, attempt, full = 0, 1, 0

    def put(ev: E.Event) -> None:
        nonlocal n, full
        full += len(E.encode(journal.append(ev)).encode()) + 1
        n += 1

    put(E.Start(t0, 1, 4242, "A", ("yolo", "train")))
    put(E.State(t0, "RUNNING", "progress"))
    for s in range(1, seconds + 1):
        ts = t0 + s
        done = int(s * RATE)
        epoch, batch = divmod(done, BATCHES)
        tpl = progress[s % len(progress)]
        decay = 1.0 / (1.0 + s / 86400)
        losses = {k: round(v * (0.5 + 0.5 * decay), 4) for k, v in tpl.losses.items()}
        put(
            E.Progress(
                ts,
                min(epoch + 1, EPOCHS),
                EPOCHS,
                batch + 1,
                BATCHES,
                losses,
                rate=round(RATE + (s % 7 - 3) / 100, 2),
            )
        )
        if s % 30 == 0:
            put(dataclasses.replace(projection, ts=ts, seq=None))
        if s % 3600 == 0:
            put(dataclasses.replace(warnings[(s // 3600) % len(warnings)], ts=ts, seq=None))
        if s % 86400 == 43200:  # a stall and a restart a day
            attempt += 1
            put(E.Stall(ts, "train", 300.0, "deadlock", detail="a worker in futex_wait"))
            put(E.State(ts, "STALLED", "no batch for 300 s"))
            put(E.Restart(ts, attempt, "stall: deadlock", "B", "last.pt"))
            put(E.Start(ts + 1, attempt, 4242 + attempt, "B", ("yolo", "train")))
            put(E.State(ts + 1, "RUNNING", "progress"))
    journal.close()
    return n, time.perf_counter() - started, full


def write_spec(run_dir: Path, job: str) -> None:
    from trainctl.store.spec import RunSpec

    RunSpec(
        job_name=job,
        kind="command",
        command=[sys.executable, "-c", TRAINER],
        preset=None,
        host="bench",
        stall={"startup_timeout": 3600, "train_timeout": 3600},
    ).save(run_dir / "spec.json")


# ---------------------------------------------------------------------- measurements (child)
def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def status_before(run_dir: Path) -> dict:
    """What `trainctl status` did with no agent before snapshots: the spec, then the whole
    journal read twice (the offline hello, then the last event of each type)."""
    from trainctl.store.journal import read_events

    status = {"state": "UNKNOWN"}
    for ev in read_events(run_dir / "events.jsonl"):
        if isinstance(ev, E.State):
            status["state"] = ev.state
        elif isinstance(ev, E.Start):
            status.update(attempt=ev.attempt, preset=ev.preset)
    last: dict[str, E.Event] = {}
    for ev in read_events(run_dir / "events.jsonl"):
        last[ev.type] = ev
    return status


class _FullReplay:
    """The client as the bridge used it before snapshots: a hello, the whole journal."""

    def __init__(self, client) -> None:
        self.client = client

    async def connect(self, since: int = 0, snapshot: bool = False, tail=None):
        return await self.client.connect(since=since)

    def events(self):
        return self.client.events()

    async def command(self, name, /, **args):
        return await self.client.command(name, **args)

    async def close(self):
        await self.client.close()


LIMIT_S = 300.0  # a before that takes longer is reported as "over", with how far it got


async def dashboard(factory, target: int) -> dict:
    """The real dashboard, headless: seconds from its start until it shows the run's state
    and the journal up to seq ``target`` (or, past LIMIT_S, how far it got)."""
    from trainctl.tui.app import TrainctlApp

    app = TrainctlApp(factory)
    t0 = time.perf_counter()
    async with app.run_test(size=(120, 40)) as pilot:
        while True:
            model = app.dashboard.model
            if model.last_seq >= target and model.progress is not None and model.state == "RUNNING":
                return {"s": time.perf_counter() - t0}
            if time.perf_counter() - t0 > LIMIT_S:
                return {"s": time.perf_counter() - t0, "over": True, "seq": model.last_seq}
            await pilot.pause(0.02)


def child(args: list[str]) -> None:
    what, run_dir = args[0], Path(args[1])
    t0 = time.perf_counter()
    if what == "status-before":
        status_before(run_dir)
        out = {"s": time.perf_counter() - t0}
    elif what.startswith("dash"):
        from trainctl.client.connection import AgentClient, UnixTransport

        target = int(args[2])
        if what.endswith("ssh"):
            from trainctl.hosts.ssh import SshHost
            from trainctl.hosts.ssh_transport import SshTransport

            conf = json.loads(args[3])
            host = SshHost(
                conf["alias"],
                ssh_config=Path(conf["config"]),
                control_dir=Path(conf["control"]),
                remote_trainctl=TRAINCTL,
            )
            base = lambda: AgentClient(SshTransport(host, str(run_dir)))  # noqa: E731
        else:
            base = lambda: AgentClient(UnixTransport(run_dir / "agent.sock"))  # noqa: E731
        factory = (lambda: _FullReplay(base())) if "before" in what else base
        out = asyncio.run(dashboard(factory, target))
        if what.endswith("ssh"):
            host.close()
    else:
        raise SystemExit(f"unknown measurement {what}")
    out["rss_mb"] = peak_mb()
    print(json.dumps(out))


def measure(*args: str) -> dict:
    r = subprocess.run(
        [sys.executable, __file__, "--child", *args], capture_output=True, text=True, timeout=900
    )
    if r.returncode != 0:
        raise RuntimeError(f"{args[0]}: {r.stderr.strip()[-1500:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def cli_time(*args: str) -> tuple[float, float]:
    """Wall and CPU seconds of `trainctl *args` (the CPU time says what a loaded machine hides)."""
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([*TRAINCTL, *args], capture_output=True, text=True, timeout=900, cwd=ROOT)
    dt = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode not in (0, 3):
        raise RuntimeError(f"trainctl {' '.join(args)}: {r.stderr.strip()[-800:]}")
    return dt, (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)


def lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


# ---------------------------------------------------------------------- the bench
def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=float, default=10.0)
    ap.add_argument("--from", dest="source", type=Path, default=DEMO if DEMO.exists() else HANDMADE)
    ap.add_argument("--no-ssh", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-long-") as d:
        tmp = Path(d)
        run_dir = tmp / "run"
        n, dt, full = build(run_dir, args.days, args.source)
        size = (run_dir / "events.jsonl").stat().st_size
        print(f"journal: {args.days:g} days, {n:,} events from {args.source.name}, written in {dt:.1f} s")
        print(
            f"journal size: {size / 2**20:.1f} MiB, {size / 1e6 / args.days:.1f} MB/day "
            f"({size / 2**20 / args.days:.1f} MiB/day), {size / n:.0f} bytes/event; "
            f"before (every line in full): {full / 2**20:.1f} MiB, {full / 1e6 / args.days:.1f} MB/day"
        )
        write_spec(run_dir, f"bench-long-{os.getpid()}")

        print("\n-- no agent (the run ended, or its agent died) --")
        before = measure("status-before", str(run_dir))
        print(f"status before (whole journal):       {before['s']:.2f} s, {before['rss_mb']:.0f} MB peak")
        first, first_cpu = cli_time("status", str(run_dir))
        snap = run_dir / "snapshot.json"
        print(
            f"status, first (indexes the journal): {first:.2f} s ({first_cpu:.2f} s CPU; "
            f"snapshot.json {snap.stat().st_size / 1024:.0f} KiB)"
        )
        nexts = [cli_time("status", str(run_dir)) for _ in range(5)]
        version = cli_time("--version")
        print(
            f"status after (snapshot + tail):      median {statistics.median(t for t, _ in nexts):.2f} s "
            f"({statistics.median(c for _, c in nexts):.2f} s CPU; n=5; `python -m trainctl --version` "
            f"takes {version[0]:.2f} s, {version[1]:.2f} s CPU)"
        )

        print("\n-- a live agent going on with the journal --")
        snap.unlink()  # the agent indexes it itself
        agent = subprocess.Popen(
            [*TRAINCTL, "agent", str(run_dir)],
            cwd=ROOT,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=open(tmp / "agent.err", "wb"),
            env={**os.environ, "TRAINCTL_RUNS_DIR": str(tmp / "runs")},
        )
        try:
            _live(agent, run_dir, tmp, args)
        finally:
            subprocess.run([*TRAINCTL, "ctl", str(run_dir), "stop"], capture_output=True, timeout=60)
            try:
                agent.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()


def _live(agent: subprocess.Popen, run_dir: Path, tmp: Path, args) -> None:
    import psutil

    snap = run_dir / "snapshot.json"
    t0 = time.perf_counter()
    while not snap.exists():
        if agent.poll() is not None:
            raise RuntimeError(f"the agent ended: {(tmp / 'agent.err').read_text()[-1500:]}")
        time.sleep(0.05)
    print(
        f"agent: indexed the journal (snapshot.json written) {time.perf_counter() - t0:.2f} s after its start"
    )
    proc = psutil.Process(agent.pid)
    rss = [proc.memory_info().rss]
    live, live_cpu = cli_time("status", str(run_dir))
    print(f"status (live agent):                 {live:.2f} s ({live_cpu:.2f} s CPU)")
    rows = [("local", "dash-before", "dash-after")]
    if not args.no_ssh:
        rows.append(("ssh", "dash-before-ssh", "dash-after-ssh"))
        from tests.helpers.sshd import LocalSshd

        server = LocalSshd(tmp)
        host_conf = json.dumps(
            {"alias": server.alias, "config": str(server.ssh_config_path), "control": str(server.control_dir)}
        )
        host = server.make_host(remote_trainctl=TRAINCTL)
        t1 = time.perf_counter()
        host.connect()
        t2 = time.perf_counter()
        host.run([*TRAINCTL, "--version"], timeout=60)
        t3 = time.perf_counter()
        host.close()
        print(
            f"ssh alone: a new shared connection {t2 - t1:.2f} s, then `ssh HOST python -m trainctl "
            f"--version` {t3 - t2:.2f} s (each ssh attach below pays both, and the bridge's start)"
        )
    try:
        for label, before_mode, after_mode in rows:
            extra = [host_conf] if label == "ssh" else []
            for mode in (before_mode, after_mode):
                target = lines(run_dir / "events.jsonl") - 1
                got = measure(mode, str(run_dir), str(target), *extra)
                rss.append(proc.memory_info().rss)
                kind = "before (full replay)" if "before" in mode else "after (snapshot)    "
                took = (
                    f"not yet after {got['s']:.0f} s (at event {got['seq']:,} of {target:,})"
                    if got.get("over")
                    else f"{got['s']:.2f} s after start"
                )
                print(
                    f"dashboard {label:5} {kind}: state on screen {took}, client {got['rss_mb']:.0f} MB peak"
                )
    finally:
        if not args.no_ssh:
            server.stop()
    print(f"agent RSS: {max(rss) / 2**20:.0f} MB at most (sampled after each attach)")


if __name__ == "__main__":
    main()
