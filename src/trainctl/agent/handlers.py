"""The agent's command handlers, one per name in the registry (src/trainctl/core/commands.py)."""

from __future__ import annotations

from collections.abc import Callable

from trainctl.agent.context import RunContext
from trainctl.config import ConfigError, load_preset, preset_problems
from trainctl.core import events as E
from trainctl.core.commands import COMMANDS, CommandError, check_request
from trainctl.core.recovery import FINAL_STATES, RunState
from trainctl.store.paths import read_private, write_private


class CommandHandlers:
    def __init__(self, ctx: RunContext, hello, intake, stopper) -> None:
        self.ctx = ctx
        self.hello = hello
        self.intake = intake
        self.stopper = stopper
        self.goodput: Callable[[float], dict | None] = lambda now: None  # the snapshot keeper's
        self.resumed: Callable[[], dict | None] = lambda: None  # likewise: the last restart's resume
        self.handlers = {name: getattr(self, f"cmd_{name}") for name in COMMANDS}

    async def __call__(self, name: object, args: object) -> dict:
        """A reply: {"ok", "error", "result"}; never raises for a client's mistake."""
        try:
            name, args = check_request(name, args)
            result = await self.handlers[name](**args)
            return {"ok": True, "error": None, "result": result}
        except TypeError as e:  # a missing argument
            return {"ok": False, "error": f"{name}: {e}", "result": None}
        except (CommandError, ValueError, ConfigError, OSError) as e:
            return {"ok": False, "error": str(e), "result": None}

    @staticmethod
    def _check_preset_name(name: str) -> str:
        if not name or not all(c.isalnum() or c in "._-" for c in name) or name.startswith("."):
            raise ValueError(f"preset name {name!r}: use letters, digits, '.', '_' or '-'")
        return name

    async def cmd_status(self) -> dict:
        proj = self.ctx.projector.project(self.ctx.clock())
        out = {
            **self.hello(),
            "phase": self.intake.phase,
            "projection": E.to_dict(proj) if proj else None,
            "save_dir": self.intake.save_dir,
            "env": list(self.ctx.facts.env_names),  # names only: never a value
            "workers": self.ctx.facts.workers_seen,  # measured in the tree, not the preset's
        }
        if self.ctx.facts.gpus is not None:  # the run's own devices, the rule that chose them
            out["gpus"] = self.ctx.facts.gpus
        if (goodput := self.goodput(self.ctx.clock())) is not None:
            out["goodput"] = goodput
        if (resumed := self.resumed()) is not None:
            out["resumed"] = resumed
        if self.intake.last_progress is not None:
            out["progress"] = E.to_dict(self.intake.last_progress)
        if self.ctx.ladder is not None:  # "rung A2 (2 of 3), stable 14 m, next step up after ..."
            out["ladder"] = self.ctx.ladder.describe(proj)
        if self.intake.rank_progress:  # torchrun: each rank's last batch, the stuck ones
            out["ranks"] = rank_status(self.intake.rank_progress.values(), self.intake.stuck_ranks)
        return out

    async def _restart(self, target: str | None) -> dict:
        ctx = self.ctx
        if ctx.sm.state in FINAL_STATES:
            raise ValueError(f"the run is {ctx.sm.state.value}; start a new one with trainctl run")
        if target is not None:  # refuse a missing or invalid preset now, or one that cannot act
            refuse_keys_without_effect(ctx, load_preset(ctx.preset_path(target)))
        if ctx.facts.trainer is None:
            ctx.requests.pick_next(target)
            return {"restart": "next attempt", "preset": target}
        if not ctx.requests.restart(target):
            raise ValueError(f"the attempt is already ending ({ctx.requests.interrupt.why.value})")
        return {"restart": "now", "preset": target}

    async def cmd_restart(self) -> dict:
        return await self._restart(self.ctx.facts.preset)

    async def cmd_fallback(self) -> dict:
        if not self.ctx.spec.fallback:
            raise ValueError("this run has no fallback preset (set `fallback` in the job or --fallback)")
        return await self._restart(self.ctx.spec.fallback)

    async def cmd_switch_preset(self, preset: str = "") -> dict:
        return await self._restart(self._check_preset_name(preset))

    async def cmd_ladder_unpin(self) -> dict:
        if self.ctx.ladder is None:
            raise ValueError("this run has no ladder (ladder = [...] in the job)")
        return {"unpinned": self.ctx.ladder.unpin(), "ladder": self.ctx.ladder.describe()}

    async def cmd_stop(self) -> dict:
        self.ctx.requests.stop()
        return {"stopping": True}

    async def cmd_auto_recover(self, on: bool | None = None) -> dict:
        ctx = self.ctx
        on = (not ctx.policy.auto_recover) if on is None else on
        ctx.policy.auto_recover = on
        ctx.info(f"auto-recovery {'on' if on else 'off'}", "auto_recover")
        if on and ctx.sm.state == RunState.STALLED and ctx.facts.trainer is not None:
            ctx.requests.recover()
        return {"auto_recover": on}

    async def cmd_dump_stacks(self) -> dict:
        ctx = self.ctx
        trainer = ctx.facts.trainer
        if trainer is None:
            raise ValueError("no trainer is running")
        snapshot = ctx.sm.state != RunState.STALLED
        diag = await self.stopper.diagnose(trainer, f"manual-{ctx.facts.attempt}", snapshot=snapshot)
        what = "a snapshot" if snapshot else diag.diagnosis
        where = f"stacks dumped to {diag.stacks}" if diag.stacks else "no stacks written"
        ctx.info(f"{where} ({what}: {diag.detail})", "stacks")
        return {
            "stacks": diag.stacks,
            "diagnosis": "snapshot" if snapshot else diag.diagnosis,
            "detail": diag.detail,
        }

    async def cmd_list_presets(self) -> list:
        out = []
        for path in sorted(self.ctx.files.presets.glob("*.toml")):
            try:
                desc = load_preset(path).description
            except ConfigError as e:
                desc = f"INVALID: {e}"
            out.append({"name": path.stem, "path": str(path), "description": desc})
        return out

    async def cmd_read_preset(self, name: str = "") -> dict:
        path = self.ctx.preset_path(self._check_preset_name(name))
        if not path.exists():
            raise ValueError(f"no preset named {path.stem!r} in {self.ctx.files.presets}")
        return {"name": path.stem, "path": str(path), "text": read_private(path, 1 << 20)}

    async def cmd_write_preset(self, name: str = "", text: str = "") -> dict:
        ctx = self.ctx
        pname = self._check_preset_name(name)
        path = ctx.preset_path(pname)
        problems = preset_problems(text, str(path))
        if problems:
            raise ValueError("; ".join(str(p) for p in problems))
        write_private(path, text)
        ctx.projector.expected_rates = ctx.expected_rates()
        ctx.info(f"preset {pname} saved to {path}", "preset_saved")
        return {"name": pname, "path": str(path)}

    async def cmd_set_next_preset(self, name: str = "") -> dict:
        ctx = self.ctx
        pname = self._check_preset_name(name)
        load_preset(ctx.preset_path(pname))
        ctx.requests.pick_next(pname)
        ctx.info(f"the next restart will use preset {pname}", "next_preset")
        return {"next_preset": pname}


def rank_status(progress, stuck) -> dict[str, dict]:
    """``{"0": {"epoch", "epochs", "batch", "batches", "ts", "stuck"}, ...}`` (JSON keys)."""
    return {
        str(p.rank): {
            "epoch": p.epoch,
            "epochs": p.epochs,
            "batch": p.batch,
            "batches": p.batches,
            "ts": p.ts,
            "stuck": p.rank in stuck,
        }
        for p in sorted(progress, key=lambda p: p.rank)
    }


def refuse_keys_without_effect(ctx, preset) -> None:
    """ValueError (the command's refusal) when a key of ``preset`` cannot act on this run."""
    from trainctl.agent.launch import integration_of
    from trainctl.agent.zero_code import python_command
    from trainctl.config.preset import keys_without_effect

    spec = ctx.spec
    python = spec.instrument and spec.kind == "command" and python_command(spec.command, spec.cwd)
    why = keys_without_effect(preset, spec.kind, python, integration_of(ctx.files))
    if why:
        raise ValueError("; ".join(why))
