"""What the agent runs: everything decided before the first attempt, saved as spec.json."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class RunSpec:
    job_name: str
    kind: str                                  # "ultralytics" | "command" | "torchrun"
    command: list[str] = field(default_factory=list)   # kind=command
    job_file: str | None = None                # kind=ultralytics: the job as run (run_dir/job.toml)
    preset: str | None = None                  # preset names; files live in run_dir/presets/
    fallback: str | None = None
    resume_args: list[str] = field(default_factory=list)
    resume_from: str | None = None             # the first attempt starts from this checkpoint
    stall: dict[str, float] = field(default_factory=dict)  # train_timeout, startup_timeout, val_timeout, save_timeout
    max_restarts: int = 3
    auto_recover: bool = True
    deadline: float | None = None
    cost_per_hour: float | None = None
    budget: float | None = None
    currency: str = "$"
    host: str = ""
    cwd: str = "."
    kill_grace_s: float = 10.0
    save_wait_s: float = 120.0
    rescue_wait_s: float = 30.0                # a stalled trainer's rescue save, at most
    planned_wait_s: float = 60.0               # a planned restart's save, at most
    backoff_base_s: float = 1.0
    no_progress_limit: int = 2
    kernel_log: bool = True
    progress: dict | None = None               # the job's [progress]: {"pattern", "losses"}
    setup: str = ""                            # shell lines run before the trainer ([host] setup)
    remote: bool = False                       # started on this box by `trainctl run --host`
    instrument: bool = True                    # a Python command gets the zero-code integrations
    checkpoint_every: float | None = None      # kind=command, an integration's mid-epoch saves (s)
    slurm: dict | None = None                  # the job's [slurm] (`trainctl run --slurm`)

    def save(self, path: Path) -> None:
        tmp = Path(str(path) + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> "RunSpec":
        data = json.loads(Path(path).read_text())
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})
