"""The run's own GPUs, attempt by attempt: which devices are the run's (the rules of
:mod:`trainctl.core.gpu_devices`, chosen again at every reading of an attempt), the run's
own activity on them for the still-tree watch, the tick's device rows, and the wait for
the killed attempt's memory on every device it used (:mod:`trainctl.core.gpu_release`)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from trainctl.agent.context import RunContext
from trainctl.core import gpu_devices, gpu_release
from trainctl.core.gpu_text import gpu_model_line
from trainctl.system.probes import environments


class RunGpus:
    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.devices = gpu_devices.RunDevices((), "none", "no GPU read")
        # this attempt's devices by the rule that chose them, every reading's (the memory
        # wait takes the strongest rule's: an early reading before the trainer's CUDA
        # context falls back to every device)
        self.used: dict[str, set[int]] = {}
        self.baseline: dict[int, int] = {}  # device -> used memory before this attempt started
        self.activity: float | None = None  # the run's own GPU %, last reading (None: none known)
        self.names: dict[int, str] = {}  # device -> its model, as read
        self.pids: tuple[int, ...] = ()  # the run's tree at the last reading
        self.rows: tuple[Any, ...] = ()  # the run's devices' samples, last reading
        self._said: tuple[tuple[int, ...], str] | None = None  # the devices last journaled

    def _probe(self) -> Any:
        probe = self.ctx.facts.gpu_probe
        return probe if probe is not None and hasattr(probe, "read") and probe.available()[0] else None

    async def _read(self) -> Any:
        probe = self._probe()
        if probe is None:
            return None
        return await asyncio.get_running_loop().run_in_executor(None, probe.read)

    async def begin_attempt(self) -> None:
        """Before an attempt's trainer starts: its devices are chosen afresh, and each
        device's used memory is the baseline its memory wait falls back to."""
        self.devices = gpu_devices.RunDevices((), "none", "no GPU read")
        self.used, self.activity, self._said = {}, None, None
        reading = await self._read()
        self.baseline = (
            gpu_devices.used_bytes(reading.devices, (d.index for d in reading.devices)) if reading else {}
        )

    async def sample(self, pids: tuple[int, ...], trainers: tuple[int, ...]) -> dict[str, Any] | None:
        """One reading: the run's devices among every device, the run's own activity, the
        tick's ``gpu`` dict (the first device's figures, as before, and ``devices``: a row
        per device of the run, ``rule`` and ``why``).  None without a GPU.
        ``pids``: the run's tree; ``trainers``: the processes whose environment says their
        devices (the trainer, each rank)."""
        self.activity, self.pids, self.rows = None, pids, ()
        reading = await self._read()
        if reading is None or not reading.devices:
            return None
        envs = await asyncio.get_running_loop().run_in_executor(None, environments, trainers)
        unplaced = tuple(pid for pid, _ in reading.unplaced)
        self.devices = gpu_devices.choose(reading.devices, pids, envs, unplaced)
        said = (self.devices.indices, self.devices.rule)
        if said != self._said:  # journaled when it changes: what the watch reads
            self._said = said
            where = ", ".join(map(str, self.devices.indices)) or "none"
            self.ctx.info(
                f"the run's GPUs: {where} (by {self.devices.rule}: {self.devices.why})", "gpu_devices"
            )
        self.used.setdefault(self.devices.rule, set()).update(self.devices.indices)
        self.activity, how = gpu_devices.run_activity(reading.devices, self.devices, pids, unplaced)
        rows = [d for d in reading.devices if d.index in self.devices.indices]
        self.rows = tuple(rows)
        for d in rows:
            if d.name:
                self.names[d.index] = d.name
        if self.devices.rule in ("pids", "visible-devices"):  # "all" is no finding of the run's
            self.ctx.facts.gpu_model = self.model() or self.ctx.facts.gpu_model
        run = {
            "devices": [d.as_dict() for d in rows],
            "rule": self.devices.rule,
            "why": self.devices.why,
            "own_util": self.activity,  # the run's own (what the still-tree watch counts)
            "activity": how,
            "seen": len(reading.devices),
            "source": reading.source,
        }
        self.ctx.facts.gpus = run
        return {**(rows[0].as_dict() if rows else {}), **run}

    async def for_verdict(self) -> Any:
        """The run's first device read now, its utilisation the run's own (None: not
        known), for a stall's diagnosis ("CPU quiet but the GPU reports 99% busy" only of
        the run's own work); None without a GPU."""
        if self._probe() is None:
            return None
        await self.sample(self.pids, self.pids)
        if not self.rows:
            return None
        return dataclasses.replace(self.rows[0], util_percent=self.activity)

    def verdict_devices(self) -> tuple[dict[str, Any], ...]:
        """The run's devices as last read (:meth:`for_verdict`'s reading), for a verdict's
        fields: index, model, utilisation (the device's), power."""
        return tuple(
            {"index": d.index, "name": d.name, "util": d.util_percent, "power_w": d.power_w}
            for d in self.rows
        )

    async def health_check(self, python: str | None) -> Any:
        """Before a restart: the short check of the devices the attempt used
        (system/gpu_health.py), journaled; None where there is nothing to check (no GPU
        probe, no device read: a CPU run, said nowhere) or no Python to run it with."""
        from trainctl.system import gpu_health

        devices = self.attempt_devices()[0] if self._probe() is not None else ()
        if not devices:
            return None
        if python is None:
            self.ctx.info("GPU health check skipped: the trainer's Python is not known", "gpu_health")
            return None
        loop = asyncio.get_running_loop()
        health = await loop.run_in_executor(None, gpu_health.check, python, devices)
        self.ctx.info(health.said(), "gpu_health")
        return health

    def model(self) -> str | None:
        """The model of the run's devices ("2× NVIDIA A100"), as last read; None unread."""
        used = self.attempt_devices()[0]
        names = [{"name": self.names[i]} for i in sorted(self.names) if i in used]
        return gpu_model_line(names) if names else None

    def attempt_devices(self) -> tuple[tuple[int, ...], str | None]:
        """(the attempt's devices, by the strongest rule any reading used: pids, then
        visible-devices, then all; the rule), ((), None) before any reading."""
        for rule in ("pids", "visible-devices", "all"):
            if self.used.get(rule):
                return tuple(sorted(self.used[rule])), rule
        return (), None

    async def wait_released(self, killed: tuple[int, ...], limit_s: float = gpu_release.LIMIT_S) -> None:
        """Until the killed attempt's memory is released on every device it used (under
        512 MB each), polled every 2 s, at most ``limit_s``; journaled.  No GPU: no wait."""
        ctx = self.ctx
        if self._probe() is None:
            return
        t0 = ctx.clock()
        used, rule = self.attempt_devices()
        while True:
            reading = await self._read()
            held = gpu_release.held_by_device(
                reading.devices if reading else (),
                reading.unplaced if reading else (),
                used,
                killed,
                self.baseline,
                by_pids=rule in ("pids", None),
            )
            go, why = gpu_release.may_start_all(held, ctx.clock() - t0, limit_s)
            if go:
                break
            await asyncio.sleep(gpu_release.POLL_S)
        waited = ctx.clock() - t0
        if waited > 0 or why != "released":
            where = ", ".join(str(i) for i in sorted(held) if i >= 0) or "?"
            ctx.info(f"waited {waited:.0f} s for GPU memory on GPU {where} ({why})", "gpu_release")
