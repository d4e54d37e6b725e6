"""The bridge on a week-sized replay: batched, in order, nothing dropped, UI responsive."""
from __future__ import annotations

import time

import pytest
from textual.message import Message
from tui_fakes import FakeAgent
from tui_helpers import wait_for

from trainctl.engine import events as ev
from trainctl.tui.app import TrainctlApp
from trainctl.tui.messages import EventBatch
from trainctl.tui.widgets.loss_chart import LossChart

pytestmark = pytest.mark.timeout(90)
N = 60_000


def long_journal(n: int) -> list[ev.Event]:
    events: list[ev.Event] = [ev.Start(0.0, attempt=1, pid=1, preset="A")]
    for i in range(n):
        epoch, batch = divmod(i, 41163)
        events.append(ev.Progress(float(i), epoch=epoch + 1, epochs=50, batch=batch + 1,
                                  batches=41163, losses={"box_loss": 2.0 - i / n,
                                                         "cls_loss": 3.0 - i / n}, rate=2.1))
    return [ev.with_seq(e, i) for i, e in enumerate(events)]


async def test_big_replay_is_batched_and_complete(presets):
    journal = long_journal(N)
    agent = FakeAgent(journal, {"job": "week", "state": "RUNNING", "preset": "A"}, presets)
    messages: list[Message] = []
    app = TrainctlApp(agent.client, clock=lambda: float(N))
    started = time.monotonic()
    async with app.run_test(size=(120, 40), message_hook=messages.append) as pilot:
        await wait_for(pilot, lambda: app.dashboard.model.last_seq == N, timeout=60,
                       what="the whole replay")
        elapsed = time.monotonic() - started
        batches = [m for m in messages if isinstance(m, EventBatch)]
        assert sum(len(b.events) for b in batches) == N + 1
        assert len(batches) <= 2 * (N // app.bridge._max_batch + 1) + 20
        # every loss value was folded; the model holds a bounded, downsampled history
        assert app.dashboard.model.losses["box_loss"].xs[0] == 1.0
        assert 2 * 2000 <= app.dashboard.model.chart_points() <= 2 * 8000
        chart = app.dashboard.query_one(LossChart)
        chart.flush()
        assert chart.draws < 10        # redraws are throttled, not one per batch
        data = app.dashboard.chart_data()
        assert all(len(xs) <= 401 for _, xs, _ in data.series)
        assert data.series[0][1][-1] == N   # the last point is drawn
    print(f"replayed {N + 1} events in {elapsed:.2f} s ({len(batches)} messages)")
