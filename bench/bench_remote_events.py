"""How late do a remote trainer's events reach the client over SSH? A real sshd on loopback
(tests/helpers/sshd.py), a real agent, the real client.

    .venv/bin/python bench/bench_remote_events.py [--lines 220] [--rate 10] [--epoch-batches 4]

The trainer prints `epoch=E/EE batch=B/BB loss=... stamp=<its time.time()>` at --rate lines
per second, once two clients are connected to its agent (started with `trainctl run
--detach --no-tmux`, as on a box): one through `ssh box trainctl bridge RUN_DIR`
(SshTransport, the way a remote dashboard or `trainctl attach ssh://` reaches it), one on
the agent's Unix socket (what a client on the box itself sees). For every event a client
receives, latency = client receive time - the trainer's stamp (one machine, one clock):

* progress  the journaled progress events. The journal takes progress at most once a
            second plus each epoch's first and last batch; with epochs of --epoch-batches
            (default 4) every journaled progress event is one admitted at once, so this is
            the pipeline itself: trainer pipe -> agent parse -> journal -> socket -> bridge
            -> ssh -> client. (Long epochs add up to the throttle's hold to the events it
            holds back and flushes later.)
* agent     progress event ts (the agent's clock when it parsed the line) - stamp.
* ssh minus unix socket: what the ssh path (bridge, sshd, ControlMaster, mux client)
            adds to one event, from the two receive times.
* log line  every output line, in the ephemeral `log` events the agent batches for the
            dashboard's log tail (flushed every few hundred ms).

Prints median, p90 and max; asserts nothing. Loopback hides network latency: on a real
link add about one one-way trip to each figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.sshd import LocalSshd
from trainctl.client.connection import AgentClient, UnixTransport
from trainctl.core import events as E
from trainctl.core.recovery import FINAL_STATES
from trainctl.hosts.ssh_transport import SshTransport

TRAINER = """\
import os, sys, time
go, n, per_epoch, period = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
while not os.path.exists(go):
    time.sleep(0.01)
epochs = -(-n // per_epoch)
t_next = time.time()
for i in range(n):
    e, b = i // per_epoch + 1, i % per_epoch + 1
    print(f"epoch={e}/{epochs} batch={b}/{per_epoch} loss=0.5000 stamp={time.time():.6f}", flush=True)
    t_next += period
    time.sleep(max(0.0, t_next - time.time()))
"""
LINE = re.compile(r"epoch=(\d+)/\d+ batch=(\d+)/\d+ .*stamp=([0-9.]+)")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.1f} ms"


def summary(label: str, values: list[float]) -> str:
    if not values:
        return f"{label:38} no events"
    v = sorted(values)
    p90 = v[min(len(v) - 1, round(0.9 * (len(v) - 1)))]
    return f"{label:38} median {ms(statistics.median(v))}  p90 {ms(p90)}  max {ms(v[-1])}  (n={len(v)})"


async def collect(client: AgentClient, out: dict[str, list]) -> None:
    """(receive time, event) for progress and log events until the run ends."""
    async for ev in client.events():
        now = time.time()
        if isinstance(ev, E.Progress):
            out["progress"].append((now, ev))
        elif isinstance(ev, E.Log):
            out["log"].append((now, ev))
        elif isinstance(ev, E.State) and ev.state in FINAL_STATES:
            return


def stamps_of_progress(recv: list, stamps: dict) -> tuple[list[float], list[float]]:
    client, agent = [], []
    for t, ev in recv:
        stamp = stamps.get((ev.epoch, ev.batch))
        if stamp is not None:
            client.append(t - stamp)
            agent.append(ev.ts - stamp)
    return client, agent


def stamps_of_log(recv: list) -> list[float]:
    out = []
    for t, ev in recv:
        for line in ev.lines:
            m = LINE.search(line)
            if m:
                out.append(t - float(m.group(3)))
    return out


async def measure(server: LocalSshd, tmp: Path, args) -> None:
    run_dir, go = tmp / "run", tmp / "go"
    env = {**os.environ, "TRAINCTL_RUNS_DIR": str(tmp / "runs"), "TRAINCTL_CONFIG_DIR": str(tmp / "config")}
    trainctl = str(Path(sys.executable).parent / "trainctl")
    r = await asyncio.to_thread(
        subprocess.run,
        [
            trainctl,
            "run",
            "--detach",
            "--no-tmux",
            "--run-dir",
            str(run_dir),
            "--name",
            "bench-events",
            "--",
            sys.executable,
            "-c",
            TRAINER,
            str(go),
            str(args.lines),
            str(args.epoch_batches),
            str(1.0 / args.rate),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if r.returncode != 0:
        print(f"could not start an agent: {r.stderr.strip()[-500:]}")
        return
    host = server.make_host(remote_trainctl=[trainctl])
    ssh_transport = SshTransport(host, str(run_dir))
    clients = {
        "ssh bridge": AgentClient(ssh_transport),
        "unix socket": AgentClient(UnixTransport(run_dir / "agent.sock")),
    }
    got = {name: {"progress": [], "log": []} for name in clients}
    try:
        for client in clients.values():
            await asyncio.wait_for(client.connect(since=0), 30)
        await asyncio.sleep(1.0)  # replayed startup events drained
        go.touch()
        timeout = args.lines / args.rate + 60
        await asyncio.wait_for(asyncio.gather(*(collect(c, got[n]) for n, c in clients.items())), timeout)
    finally:
        for client in clients.values():
            await client.close()
        await ssh_transport.close()
        info = run_dir / "agent.json"
        if info.exists():  # the agent ends with its run; make sure
            pid = json.loads(info.read_text()).get("pid")
            deadline = time.monotonic() + 10
            while pid and time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                await asyncio.sleep(0.1)
            else:
                if pid:
                    os.kill(pid, signal.SIGKILL)
    stamps = {}
    for line in (run_dir / "train.log").read_text().splitlines():
        m = LINE.search(line)
        if m:
            stamps[(int(m.group(1)), int(m.group(2)))] = float(m.group(3))
    print(
        f"trainer: {len(stamps)} lines at {args.rate:g}/s, epochs of {args.epoch_batches} "
        f"batches; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    for name in clients:
        client_lat, agent_lat = stamps_of_progress(got[name]["progress"], stamps)
        if name == "ssh bridge":
            print(summary("trainer line -> agent (parsed)", agent_lat))
        print(summary(f"progress event -> client, {name}", client_lat))
        print(summary(f"log line -> client, {name}", stamps_of_log(got[name]["log"])))
    unix = {ev.seq: t for t, ev in got["unix socket"]["progress"]}
    extra = [t - unix[ev.seq] for t, ev in got["ssh bridge"]["progress"] if ev.seq in unix]
    print(summary("ssh minus unix socket, same event", extra))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=220, help="progress lines the trainer prints")
    ap.add_argument("--rate", type=float, default=10.0, help="lines per second")
    ap.add_argument("--epoch-batches", type=int, default=4, help="batches per epoch")
    args = ap.parse_args()
    # Short: the agent's socket lives in the run directory.
    tmp = Path(tempfile.mkdtemp(prefix="bre-", dir="/tmp"))
    try:
        server = LocalSshd(tmp)
        try:
            print(f"sshd on 127.0.0.1:{server.port}")
            asyncio.run(measure(server, tmp, args))
        finally:
            server.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
