"""What the Transformers and Lightning integrations cost a training step (prints figures;
asserts nothing).

Usage: .venv/bin/python bench/bench_instrument_callbacks.py [--steps 300] [--rounds 3]

Trains the e2e scripts' tiny models (tests/helpers/scripts: a 1-layer GPT-2 of 16 dims
under the Trainer, a Linear(8, 1) under Lightning; no workers, no load time, no periodic
checkpoints) for ``--steps`` steps in a child process, alternating plain runs and runs
with the integration attached as the bootstrap would (side channel to a temp file), and
prints the median CPU time (user + system of the child: less disturbed by other load than
the wall time) per step of each and the difference.  These models' steps take about a
millisecond, so the difference is the callbacks' whole cost, not a share of a real step.

Measured (2 loaded cores, load average ~10; Python 3.11, torch 2.14 CPU): see the
report of the commit that added it; run it again on your own box.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "tests" / "helpers" / "scripts"
PRELUDE = """
import runpy, sys, importlib
lib, script = sys.argv[1], sys.argv[2]
if lib:
    module = importlib.import_module(lib)
    integration = importlib.import_module("trainctl.engine.instrument." + ("lightning" if "lightning" in lib else lib))
    integration.attach(module)
sys.argv = sys.argv[2:]
runpy.run_path(script, run_name="__main__")
"""


def child_cpu(argv: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    cases = {
        "transformers": (SCRIPTS / "hf_trainer.py", ["--epochs", "1", "--items", str(4 * a.steps),
                                                     "--save-steps", str(10 * a.steps)]),
        "lightning": (SCRIPTS / "lightning_train.py", ["--epochs", "1", "--items", str(4 * a.steps),
                                                       "--save-steps", str(10 * a.steps)]),
    }
    with tempfile.TemporaryDirectory() as tmp:
        side = Path(tmp) / "side.jsonl"
        side.touch()
        base = {k: v for k, v in os.environ.items() if not k.startswith("TRAINCTL_")}
        for lib, (script, args) in cases.items():
            times: dict[str, list[float]] = {"plain": [], "attached": []}
            for r in range(a.rounds):
                for mode in ("plain", "attached"):
                    env = dict(base)
                    if mode == "attached":
                        env.update(TRAINCTL_EVENTS_PATH=str(side), TRAINCTL_RUN_DIR=tmp)
                    argv = [sys.executable, "-c", PRELUDE, lib if mode == "attached" else "", str(script),
                            str(Path(tmp) / f"out-{lib}-{mode}-{r}"), "--workers", "0", "--load-time", "0", *args]
                    times[mode].append(child_cpu(argv, env))
            plain, attached = statistics.median(times["plain"]), statistics.median(times["attached"])
            print(f"{lib}: {a.steps} steps, CPU per run (median of {a.rounds}): plain {plain:.2f} s, "
                  f"attached {attached:.2f} s; difference {(attached - plain) / a.steps * 1000:+.3f} ms a step "
                  f"(runs include start-up: imports, model; same in both)", flush=True)
        print(f"side channel lines written: {len(side.read_bytes().splitlines())}")


if __name__ == "__main__":
    main()
