"""How fast is the SSH path? A real sshd on loopback (tests/helpers/sshd.py), the real client.

    .venv/bin/python bench/bench_remote.py [--agent]

Prints: time to open the shared connection; a remote command over it vs over a fresh
connection each time; send_bytes throughput; SshTransport line round trip and bulk
throughput through a relay (what a reattach's journal replay costs per MB). With --agent,
also a real agent on this machine reached through `trainctl bridge` over ssh vs its Unix
socket: time to hello + journal replay, and the `status` command round trip.
Loopback hides network latency: on a real link add the round-trip time to each command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.sshd import LocalSshd  # noqa: E402
from trainctl.hosts.ssh_transport import SshTransport  # noqa: E402

RELAY = "import sys\nfor line in sys.stdin.buffer:\n    sys.stdout.buffer.write(line)\n    sys.stdout.buffer.flush()\n"
BULK = (
    "import sys\nn = int(sys.argv[-1])\nline = b'x' * 1023 + b'\\n'\n"
    "for _ in range(n):\n    sys.stdout.buffer.write(line)\n"
)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def bench_host(server: LocalSshd) -> None:
    host = server.make_host()
    connects = []
    for _ in range(3):
        host.close()
        t0 = time.perf_counter()
        host.connect()
        connects.append(time.perf_counter() - t0)
    print(f"open the shared connection (ControlMaster):  median {ms(statistics.median(connects))}  (n=3)")
    shared = timed(lambda: host.run(["true"]), 20)
    print(
        f"remote `true` over the shared connection:    median {ms(statistics.median(shared))}"
        f"  p90 {ms(sorted(shared)[17])}  (n=20)"
    )
    direct_argv = [
        "ssh",
        "-F",
        str(server.ssh_config_path),
        "-o",
        "ControlPath=none",
        "-T",
        "--",
        server.alias,
        "true",
    ]
    direct = timed(lambda: subprocess.run(direct_argv, check=True, stdin=subprocess.DEVNULL), 10)
    print(f"remote `true` over a new connection each:    median {ms(statistics.median(direct))}  (n=10)")
    blob = os.urandom(20 * 1024 * 1024)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        host.send_bytes(blob, f"{d}/blob")
        dt = time.perf_counter() - t0
        assert Path(d, "blob").read_bytes() == blob
    print(f"send_bytes 20 MiB:                           {dt:.2f} s  ({20 / dt:.0f} MiB/s)")


async def bench_transport(server: LocalSshd) -> None:
    host = server.make_host(remote_trainctl=[sys.executable, "-c", RELAY])
    t0 = time.perf_counter()
    transport = SshTransport(host, "/unused")
    reader, writer = await transport.open()
    line = json.dumps({"op": "cmd", "id": 1, "cmd": "status", "args": {}}).encode() + b"\n"
    writer.write(line)
    await writer.drain()
    await reader.readline()
    first = time.perf_counter() - t0
    rtts = []
    for _ in range(200):
        t1 = time.perf_counter()
        writer.write(line)
        await writer.drain()
        await reader.readline()
        rtts.append(time.perf_counter() - t1)
    writer.close()
    await transport.close()
    print(f"SshTransport open + first line echoed:       {ms(first)}")
    print(
        f"SshTransport line round trip (relay):        median {ms(statistics.median(rtts))}"
        f"  p90 {ms(sorted(rtts)[179])}  (n=200)"
    )

    n = 50 * 1024  # 50 MiB of 1 KiB lines
    host = server.make_host(remote_trainctl=[sys.executable, "-c", BULK])
    transport = SshTransport(host, str(n))
    t0 = time.perf_counter()
    reader, writer = await transport.open()
    got = 0
    while chunk := await reader.read(1 << 20):
        got += len(chunk)
    dt = time.perf_counter() - t0
    writer.close()
    await transport.close()
    assert got == n * 1024, got
    print(f"SshTransport bulk 50 MiB of lines:           {dt:.2f} s  ({50 / dt:.0f} MiB/s)")


async def bench_agent(server: LocalSshd, tmp: Path) -> None:
    from trainctl.client.connection import AgentClient, UnixTransport

    run_dir = tmp / "run"
    env = {**os.environ, "TRAINCTL_RUNS_DIR": str(tmp / "runs")}
    trainer = (
        "import time\nfor i in range(1, 10**6):\n"
        "    print(f'Epoch 1/3 {i}/1000000 loss=0.5', flush=True)\n    time.sleep(0.002)\n"
    )
    trainctl = str(Path(sys.executable).parent / "trainctl")
    r = subprocess.run(
        [
            trainctl,
            "run",
            "--detach",
            "--no-tmux",
            "--run-dir",
            str(run_dir),
            "--",
            sys.executable,
            "-c",
            trainer,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if r.returncode != 0:
        print(f"agent: could not start one ({r.stderr.strip()[-300:]})")
        return
    try:
        await asyncio.sleep(5)  # let the journal grow a little
        host = server.make_host(remote_trainctl=[trainctl])
        for label, transport in (
            ("unix socket", UnixTransport(run_dir / "agent.sock")),
            ("ssh bridge ", SshTransport(host, str(run_dir))),
        ):
            client = AgentClient(transport)
            t0 = time.perf_counter()
            try:
                hello = await client.connect(since=0)
            except Exception as e:  # the agent is someone else's work in progress
                print(f"agent via {label}: unavailable: {e}")
                continue
            t_hello = time.perf_counter() - t0
            journal = run_dir / "events.jsonl"
            n = journal.read_bytes().count(b"\n") if journal.exists() else 0
            if n:
                async for ev in client.events():
                    if ev.seq is not None and ev.seq >= n - 1:
                        break
            t_replay = time.perf_counter() - t0
            rtts = []
            for _ in range(20):
                t1 = time.perf_counter()
                await client.command("status")
                rtts.append(time.perf_counter() - t1)
            await client.close()
            print(
                f"agent via {label}: hello {ms(t_hello)}, hello + replay of {n} events "
                f"{ms(t_replay)}, `status` round trip median {ms(statistics.median(rtts))} "
                f"(n=20; state {hello.get('state')})"
            )
            if isinstance(transport, SshTransport):
                await transport.close()
    finally:
        subprocess.run([trainctl, "ctl", str(run_dir), "stop"], env=env, capture_output=True, timeout=60)
        info = run_dir / "agent.json"
        if info.exists():
            pid = json.loads(info.read_text()).get("pid")
            deadline = time.monotonic() + 30
            while pid and time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
            else:
                if pid:
                    os.kill(pid, signal.SIGKILL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agent", action="store_true", help="also start a real agent")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-remote-") as d:
        server = LocalSshd(Path(d))
        try:
            print(f"sshd on 127.0.0.1:{server.port}; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.1f}")
            bench_host(server)
            asyncio.run(bench_transport(server))
            if args.agent:
                asyncio.run(bench_agent(server, Path(d)))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
