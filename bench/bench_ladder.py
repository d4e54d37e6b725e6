"""Does the ladder find the stable maximum, and pay for itself?  A simulation over hours of
virtual time: the ladder's own policy (core/ladder.py) and the preset history's estimator
(core/preset_risk.py) drive a run whose rungs hang at random (Poisson, seeded) at rates
that grow with their workers; the same work, the same hang draws, is run

- ``ladder``: the ladder (down on a hang, up after a stable stretch when it pays);
- ``fallback``: today's behaviour: the fastest rung until its first hang, then the safest
  rung for the rest of the run;
- ``stay <rung>``: one rung throughout, each.

"Settled" is the rung the ladder run spent the most hours on (a ladder keeps trying the rung
above once per stretch while that pays, so its last rung is not the measure).  The ETA is
the one made half-way through the work: the rest on the settled rung at its rate, plus its
learned expected incident cost; its error is taken of the time then left.

A hang costs ``HANG_COST_S`` (detection, restart, start-up, work redone); a step up costs
``STEP_UP_COST_S`` (a planned restart: save, start-up).  The goal (issue 31): the ladder
settles on the rung with the least expected time per batch (the fastest stable one),
finishes sooner than ``fallback``, never steps up twice in one stretch, and the ETA the
projection would give on the settled rung (remaining work at its rate, plus its expected
incident cost) is within 10 % of when the run ends.

It is a simulation, not real trainings: the real processes (a hang found, a planned restart
that saves first, real DataLoader workers) are tests/e2e/test_ladder.py's.

    .venv/bin/python bench/bench_ladder.py [--seeds 20] [--hours 24]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

from trainctl.core.ladder import LadderPolicy
from trainctl.core.preset_risk import estimate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doc_tables import Recorder, add_docs_flag

DOC_TABLES = {
    "ladder-rungs": ("rung", "it/s", "hangs/h (true)", "expected s/batch"),
    "ladder-policies": ("policy", "median end h", "min h", "max h"),
    "ladder-findings": ("what", "figure"),
}


RUNGS = ("W8", "W4", "W2", "W0")
RATE = {"W8": 3.0, "W4": 2.6, "W2": 2.3, "W0": 1.8}  # batches per second
HANGS_PER_H = {"W8": 12.0, "W4": 0.5, "W2": 0.05, "W0": 0.0}  # the truth the runs do not know
HANG_COST_S = 120.0
STEP_UP_COST_S = 40.0
DT_S = 10.0
GOAL_PCT = 10.0
CONSIDER_EVERY_S = 300.0  # the agent weighs a step up at each projection; here every 5 min


def expected_s_per_batch(rung: str) -> float:
    return (1.0 / RATE[rung]) * (1.0 + HANGS_PER_H[rung] * HANG_COST_S / 3600.0)


class Sim:
    """One run of ``batches`` batches; ``policy``: ladder, fallback, or a rung's name."""

    def __init__(self, batches: float, seed: int, policy: str) -> None:
        self.left, self.t = float(batches), 0.0
        self.rng = random.Random(seed)
        self.policy = policy
        self.hours = dict.fromkeys(RUNGS, 0.0)
        self.hangs = dict.fromkeys(RUNGS, 0)
        self.ladder = LadderPolicy(RUNGS, 0.0, switch_cost_s=STEP_UP_COST_S) if policy == "ladder" else None
        self.rung = RUNGS[0] if policy in ("ladder", "fallback") else policy
        self.ups = 0
        self.up_times: list[float] = []
        self.eta_at_settle: float | None = None
        self.last_move = 0.0
        self.considered = 0.0

    def risks(self):
        return [estimate(self.hours[r], self.hangs[r], self.hangs[r] * HANG_COST_S) for r in RUNGS]

    def step(self) -> None:
        r = self.rung
        self.hours[r] += DT_S / 3600.0
        if self.rng.random() < HANGS_PER_H[r] * DT_S / 3600.0:
            self.hangs[r] += 1
            self.t += DT_S / 2 + HANG_COST_S  # it ran half the step, then the hang's cost
            self.left -= RATE[r] * DT_S / 2
            if self.ladder is not None:
                self.ladder.on_hang(self.t, "a deadlock")
                self.rung, self.last_move = self.ladder.preset, self.t
            elif self.policy == "fallback":
                self.rung = RUNGS[-1]
            return
        self.t += DT_S
        self.left -= RATE[r] * DT_S
        if self.ladder is not None and self.t - self.considered >= CONSIDER_EVERY_S:
            self.considered = self.t
            epoch_s = 3600.0  # an epoch of an hour
            step = self.ladder.consider_up(
                self.t, max(self.left, 0.0), [RATE[x] for x in RUNGS], self.risks(), epoch_s
            )
            if step is not None:
                self.ups += 1
                self.up_times.append(self.t)
                self.t += STEP_UP_COST_S
                self.rung, self.last_move = self.ladder.preset, self.t

    def settled(self) -> str:
        """The rung the run spent the most hours on."""
        return max(RUNGS, key=lambda r: self.hours[r])

    def run(self) -> Sim:
        half = self.left / 2
        while self.left > 0:
            self.step()
            if self.ladder is not None and self.eta_at_settle is None and self.left <= half:
                # the projection half-way: the rest on the rung used most, with its learned risk
                rung = self.settled()
                risk = self.risks()[RUNGS.index(rung)]
                self.eta_at_settle = self.t + self.left / RATE[rung] * (1 + risk.loss_s_per_h / 3600.0)
                self.settle_t = self.t
        return self


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--hours", type=float, default=24.0, help="the work, in hours on the safest rung")
    add_docs_flag(p)
    args = p.parse_args(argv)
    rec = Recorder(DOC_TABLES, args.docs)
    batches = args.hours * 3600 * RATE[RUNGS[-1]]
    best = min(RUNGS, key=expected_s_per_batch)
    rec.publish(
        "ladder-rungs",
        [[r, f"{RATE[r]:.1f}", f"{HANGS_PER_H[r]:.2f}", f"{expected_s_per_batch(r):.4f}"] for r in RUNGS],
    )
    names = ["ladder", "fallback", *(f"stay {r}" for r in RUNGS)]
    ends: dict[str, list[float]] = {n: [] for n in names}
    settled, errors, faster, one_per_stretch = [], [], 0, True
    for seed in range(args.seeds):
        for n in names:
            sim = Sim(batches, seed, n.split()[-1] if n.startswith("stay") else n).run()
            ends[n].append(sim.t / 3600)
            if n == "ladder":
                lad = sim
        assert lad.ladder is not None
        settled.append(lad.settled())
        faster += ends["ladder"][-1] < ends["fallback"][-1]
        gaps = [b - a for a, b in zip(lad.up_times, lad.up_times[1:], strict=False)]
        one_per_stretch &= all(g >= 3600.0 for g in gaps)
        if lad.eta_at_settle is not None and lad.t > lad.settle_t:
            errors.append(100 * abs(lad.eta_at_settle - lad.t) / (lad.t - lad.settle_t))
    rec.publish(
        "ladder-policies",
        [[n, f"{statistics.median(v):.2f}", f"{min(v):.2f}", f"{max(v):.2f}"] for n, v in ends.items()],
    )
    counts = {r: settled.count(r) for r in RUNGS if settled.count(r)}
    findings: list[list[object]] = [
        ["the work", f"{batches:.0f} batches ({args.hours:g} h on {RUNGS[-1]}); {args.seeds} seeds"],
        ["the fastest stable rung in the long run (least expected time)", best],
        ["ladder settled on (the rung it ran longest, runs)", f"{counts} (goal: {best})"],
        ["ladder finished sooner than fallback", f"in {faster} of {args.seeds} runs"],
        ["at most one step up per stretch", one_per_stretch],
    ]
    if errors:
        findings.append(
            [
                "settled rung's ETA made half-way, error of the time then left",
                f"median {statistics.median(errors):.1f} %, max {max(errors):.1f} % "
                f"(goal: within {GOAL_PCT:g} %), {len(errors)} runs",
            ]
        )
    rec.publish("ladder-findings", findings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
