"""The bridge on a week-sized replay: batched, in order, nothing dropped, UI responsive."""

from __future__ import annotations

import time

import pytest
from textual.message import Message
from tui_fakes import FakeAgent
from tui_helpers import wait_for

from trainctl.core import events as ev
from trainctl.tui.app import TrainctlApp
from trainctl.tui.messages import EventBatch
from trainctl.tui.widgets.loss_chart import LossChart

pytestmark = pytest.mark.timeout(90)
N = 60_000


def long_journal(n: int) -> list[ev.Event]:
    events: list[ev.Event] = [ev.Start(0.0, attempt=1, pid=1, preset="A")]
    for i in range(n):
        epoch, batch = divmod(i, 41163)
        events.append(
            ev.Progress(
                float(i),
                epoch=epoch + 1,
                epochs=50,
                batch=batch + 1,
                batches=41163,
                losses={"box_loss": 2.0 - i / n, "cls_loss": 3.0 - i / n},
                rate=2.1,
            )
        )
    return [ev.with_seq(e, i) for i, e in enumerate(events)]


async def test_big_replay_is_batched_and_complete(presets):
    journal = long_journal(N)
    agent = FakeAgent(journal, {"job": "week", "state": "RUNNING", "preset": "A"}, presets)
    messages: list[Message] = []
    app = TrainctlApp(agent.client, clock=lambda: float(N))
    started = time.monotonic()
    async with app.run_test(size=(120, 40), message_hook=messages.append) as pilot:
        await wait_for(pilot, lambda: app.dashboard.model.last_seq == N, timeout=60, what="the whole replay")
        elapsed = time.monotonic() - started
        batches = [m for m in messages if isinstance(m, EventBatch)]
        assert sum(len(b.events) for b in batches) == N + 1
        assert len(batches) <= 2 * (N // app.bridge._max_batch + 1) + 20
        # every loss value was folded; the model holds a bounded, downsampled history
        assert app.dashboard.model.losses["box_loss"].xs[0] == 1.0
        assert 2 * 2000 <= app.dashboard.model.chart_points() <= 2 * 8000
        chart = app.dashboard.query_one(LossChart)
        chart.flush()
        assert chart.draws < 10  # redraws are throttled, not one per batch
        data = app.dashboard.chart_data()
        assert all(len(xs) <= 401 for _, xs, _ in data.series)
        assert data.series[0][1][-1] == N  # the last point is drawn
    print(f"replayed {N + 1} events in {elapsed:.2f} s ({len(batches)} messages)")


class _Journal:
    """A client of a run with no agent: its hello says so (``live`` false), its journal
    is all there is, and the stream ends at once (as src/trainctl/client/connection.py's offline replay)."""

    def __init__(self, hello: dict, looks: list[float]) -> None:
        self.hello, self.looks = hello, looks

    async def connect(self, since: int = 0, snapshot: bool = False) -> dict:
        import asyncio

        self.looks.append(asyncio.get_running_loop().time())
        return dict(self.hello)

    async def events(self):
        return
        yield

    async def close(self) -> None:
        return None


class _Target:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    def post_message(self, message: Message) -> bool:
        self.messages.append(message)
        return True


@pytest.mark.parametrize(
    "hello, cap",
    [
        ({"live": True, "state": "RUNNING"}, 0.01),  # an agent that hangs up: again at once
        ({"live": False, "state": "PENDING"}, 0.04),  # no agent (a queued Slurm job): every 0.04
        ({"live": False, "state": "FINISHED"}, 0.16),  # the run is over: up to the backoff's max
    ],
)
async def test_a_run_without_agent_is_looked_at_again_less_often(monkeypatch, hello, cap):
    """Each look of a run with no agent reads its snapshot (15 ms for a day-long run, on the
    UI's loop): not every 0.5 s for ever, as after a live agent's hang-up."""
    import asyncio

    from trainctl.tui import bridge as bridge_mod
    from trainctl.tui.messages import AgentDisconnected

    monkeypatch.setattr(bridge_mod, "OFFLINE_RELOOK_S", 0.04)
    looks: list[float] = []
    target = _Target()
    b = bridge_mod.Bridge(lambda: _Journal(hello, looks), target, backoff=(0.01, 0.16))
    task = asyncio.ensure_future(b.follow())
    await asyncio.sleep(1.2)
    task.cancel()
    delays = [m.retry_in for m in target.messages if isinstance(m, AgentDisconnected)]
    assert len(delays) >= 6
    assert max(delays[5:]) == pytest.approx(cap) and min(delays[5:]) == pytest.approx(cap)
