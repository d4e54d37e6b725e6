"""A fake Spawner that replays recorded trainer histories, and an asyncio loop on virtual
time, so the agent's attempt loop runs a whole recovery in milliseconds.

A history is a list of steps, as honcho's tests replay a manager's:
``('start', {'pid': 123})``, ``('line', b'Epoch 1/3 ...')``, ``('side', event)``,
``('silence', 30)``, ``('exit', {'returncode': 0})``, ``('hang', {})`` (until killed),
``('spawn_error', 'No such file')``, ``('answers', steps)`` (from then on, a save request
— SIGUSR1 to the main pid — plays ``steps`` beside the history: a handler that runs even
while the history hangs; without it a request goes unanswered, as a native spin).  Every step is timestamped on the virtual clock in
``FakeSpawner.log``.
"""

from __future__ import annotations

import asyncio
import math
import selectors
from types import SimpleNamespace

from trainctl.core import events as E
from trainctl.system.diagnose import Diagnosis
from trainctl.system.probes import ProcSample
from trainctl.system.process import KillReport


class _VirtualSelector:
    """The loop's selector: real I/O is still polled (the loop's self-pipe, executor results),
    but a wait for a timer returns at once with the virtual clock moved to that timer."""

    def __init__(self, loop_ref) -> None:
        self._real = selectors.DefaultSelector()
        self._loop_ref = loop_ref

    def select(self, timeout=None):
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            return self._real.select(None)  # no timer at all: wait for real I/O
        self._loop_ref().advance(timeout)
        return []

    def __getattr__(self, name):
        return getattr(self._real, name)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """Its time starts at 0 (fine float steps); ``wall()`` is that time as a unix time."""

    EPOCH = 1_700_000_000.0

    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(selector=_VirtualSelector(lambda: self))

    def time(self) -> float:
        return self._now

    def wall(self) -> float:
        return self.EPOCH + self._now

    def advance(self, dt: float) -> None:
        self._now = max(self._now + max(0.0, dt), math.nextafter(self._now, math.inf))


def run_virtual(coro_fn):
    """Run ``coro_fn(loop)`` on a fresh virtual-time loop; returns its result."""
    loop = VirtualTimeLoop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro_fn(loop))
    finally:
        asyncio.set_event_loop(None)
        loop.close()


class FakeTrainer:
    orphan = False  # the Trainer protocol's optional capabilities: not supported
    save_on_request = False
    exit_unknown = None

    def alive(self):
        return self.returncode is None

    def rank_output(self):
        return None

    def offsets(self):
        return None

    def __init__(self, spawner: FakeSpawner, steps: list, pid: int, argv, env) -> None:
        self.spawner = spawner
        self.pid = pid
        self.argv, self.env = list(argv), dict(env)
        self.returncode: int | None = None
        self.log_dropped = 0
        self.log_error: str | None = None
        self.diagnosis = "deadlock"
        self.fail_diagnose = False
        self.diagnose_s = 0.0  # how long its diagnosis takes (py-spy of every process)
        self.sampler = SimpleNamespace(last=())  # the watch's last tree sample (its main)
        self.fail_output = False
        self.answers: list | None = None
        self._answering: list[asyncio.Task] = []
        self._out: asyncio.Queue = asyncio.Queue()
        self._side: asyncio.Queue = asyncio.Queue()
        self._exited = asyncio.get_running_loop().create_future()
        self._driver = asyncio.create_task(self._play(steps))

    async def _play(self, steps: list) -> None:
        for kind, arg in steps:
            if kind == "answers":
                self.answers = list(arg)
                continue
            self.spawner.note(kind, self.pid, arg)
            if kind == "line":
                self._out.put_nowait(arg if arg.endswith(b"\n") else arg + b"\n")
            elif kind == "side":
                self._side.put_nowait((E.encode(arg) + "\n").encode())
            elif kind == "silence":
                await asyncio.sleep(arg)
            elif kind == "exit":
                self._finish(arg.get("returncode", 0))
                return
            elif kind == "hang":
                await asyncio.Future()
            elif kind == "diagnosis":
                self.diagnosis = arg
            elif kind == "fail_diagnose":
                self.fail_diagnose = True
            elif kind == "diagnose_s":
                self.diagnose_s = arg
            elif kind == "main":  # (status, cpu_percent) of its main process in the last sample
                self.sampler.last = (
                    ProcSample(self.pid, 1, "main", "python", arg[0], arg[1], None, 1, None),
                )
            elif kind == "fail_output":
                self.fail_output = True
        await asyncio.Future()  # a history that ends without an exit hangs

    def _finish(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._out.put_nowait(None)
            self._side.put_nowait(None)
            self._exited.set_result(code)
            self.spawner.note("exited", self.pid, code)

    async def output(self):
        if self.fail_output:
            raise OSError(24, "Too many open files")
        while (data := await self._out.get()) is not None:
            yield data

    async def side_lines(self):
        while (line := await self._side.get()) is not None:
            yield line

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    async def sample(self) -> tuple:
        return ()

    async def diagnose(self, stacks_dir, tag, gpu, snapshot=False, on_sampled=None):
        self.spawner.note("diagnose", self.pid, tag)
        if self.fail_diagnose:
            raise PermissionError(13, "Permission denied", str(stacks_dir))
        window = min(1.0, self.diagnose_s)  # the real one's CPU window, then the stacks
        await asyncio.sleep(window)
        if on_sampled is not None:
            on_sampled()
        await asyncio.sleep(self.diagnose_s - window)
        self.spawner.note("diagnosed", self.pid, tag)
        if snapshot:  # as the real diagnose(): a snapshot is not a verdict
            return Diagnosis(
                self.diagnosis, 0.0, None, "a snapshot of 1 running process, not a stall verdict."
            )
        return Diagnosis(self.diagnosis, 0.0, None, f"fake {self.diagnosis}")

    def signal_main(self, sig: int) -> bool:
        if self.returncode is not None:
            return False
        self.spawner.note("signal", self.pid, sig)
        if self.answers is not None:
            self._answering.append(asyncio.create_task(self._play_answer(list(self.answers))))
        return True

    async def _play_answer(self, steps: list) -> None:
        for kind, arg in steps:
            self.spawner.note(kind, self.pid, arg)
            if kind == "side":
                self._side.put_nowait((E.encode(arg) + "\n").encode())
            elif kind == "silence":
                await asyncio.sleep(arg)

    async def kill(self, grace: float, workers_at_once: bool = False) -> KillReport:
        self.spawner.note("kill", self.pid, grace)
        self._driver.cancel()
        for task in self._answering:
            task.cancel()
        self._finish(-15)
        return KillReport((self.pid,), (), (), 0.0)

    async def sweep(self) -> KillReport:
        return KillReport((), (), (), 0.0)


class FakeSpawner:
    def __init__(self, histories: list[list]) -> None:
        self.histories = list(histories)
        self.trainers: list[FakeTrainer] = []
        self.log: list[tuple[float, str, int, object]] = []

    def note(self, kind: str, pid: int, arg: object) -> None:
        self.log.append((asyncio.get_running_loop().wall(), kind, pid, arg))

    def when(self, kind: str) -> list[float]:
        return [t for t, k, _pid, _arg in self.log if k == kind]

    def adopt(self, attempt, log_path):
        return None  # nothing recorded to adopt

    async def rehold(self, trainer):
        raise OSError("a fake trainer cannot be held again")

    async def spawn(self, argv, env, cwd, log_path):
        if not self.histories:
            raise AssertionError("the agent started more attempts than the test recorded")
        steps = list(self.histories.pop(0))
        kind, arg = steps.pop(0)
        if kind == "spawn_error":
            raise OSError(2, arg)
        assert kind == "start", steps
        trainer = FakeTrainer(self, steps, arg["pid"], argv, env)
        self.trainers.append(trainer)
        self.note("start", trainer.pid, list(argv))
        return trainer
