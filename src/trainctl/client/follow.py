"""Follow an agent's events without a screen (`trainctl attach --json`), reconnecting
with backoff when the connection drops and catching up from the journal: no gap, no
duplicate (the journal's seq numbers say where to resume)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from trainctl.client.connection import AgentClient, AgentNotResponding
from trainctl.core import events as E
from trainctl.core.recovery import FINAL_STATES, exit_code
from trainctl.core.runview import ViewSnapshot


@dataclass
class _Position:
    next_seq: int = 0  # the seq of the next event to print: where a reconnection goes on


async def _relay(client: AgentClient, emit: Callable[[E.Event], None], at: _Position) -> int | None:
    """Emit the client's journal events, ``at`` kept at the next one (also when the
    connection drops midway); the final state's exit code once the run ends, else None."""
    async for ev in client.events():
        if isinstance(ev, ViewSnapshot):
            at.next_seq = ev.next_seq
            emit(ev)
            if ev.view.get("state") in FINAL_STATES:
                return exit_code(ev.view["state"])
            continue
        if ev.seq is None:
            continue  # ticks and log lines: the screen's business
        at.next_seq = ev.seq + 1
        emit(ev)
        if isinstance(ev, E.State) and ev.state in FINAL_STATES:
            return exit_code(ev.state)
    return None


def agent_gone(hello: dict) -> str:
    """Why a follow of a run with no agent ends (3): the line that says so."""
    torn = "; its last line was cut short (the agent died while writing it)" if hello.get("torn") else ""
    skipped = hello.get("unreadable") or 0
    unreadable = f"; {skipped} unreadable line{'s' if skipped != 1 else ''} skipped" if skipped else ""
    return (
        f"no agent is running for {hello.get('run_dir', 'this run')} and its journal "
        f"ends in state {hello.get('state')}{torn}{unreadable}: the agent was killed or crashed "
        "(its output is agent.out in the run directory, or its tmux pane)"
    )


async def follow(
    client_factory: Callable[[], AgentClient],
    emit: Callable[[E.Event], None],
    note: Callable[[str], None],
    *,
    max_wait_s: float = 30.0,
    give_up_s: float | None = None,
    tail: int | None = None,
    from_snapshot: bool = False,
    between_agents: Callable[[dict], Awaitable[bool]] | None = None,
) -> int:
    """Print journal events until the run ends. Returns the final state's exit code (0
    finished, 1 failed, 130 stopped by the user), 3 gave up (or the agent is gone and the
    journal does not end the run), 4 the agent does not answer (AgentNotResponding).

    The first connection replays the whole journal; or only its last ``tail`` events; or
    (``from_snapshot``) the run's view as one :class:`ViewSnapshot`, then the events after
    it.  A reconnection goes on from the last event printed.
    ``between_agents(hello)``: asked when no agent runs and the journal does not end the
    run (a Slurm run between its jobs); True: wait for the next agent, False: end (3)."""
    at = _Position()
    first = True
    delay = 0.5
    lost_since: float | None = None
    loop = asyncio.get_running_loop()
    while True:
        client = client_factory()
        try:
            if first:
                hello = await client.connect(
                    since=0, tail=tail, snapshot="always" if from_snapshot else False
                )
            else:
                hello = await client.connect(since=at.next_seq)
            first = False
            if lost_since is not None:
                note(f"reconnected to {hello.get('job', 'the agent')}; catching up from event {at.next_seq}")
            lost_since, delay = None, 0.5
            ended = await _relay(client, emit, at)
            if ended is not None:
                return ended
            if hello.get("live") is False and between_agents is not None and await between_agents(hello):
                lost_since, delay = None, 0.5
                await asyncio.sleep(1.0)
                continue
            if hello.get("live") is False:
                # The journal was all there is, and it does not end the run: nobody is
                # supervising it any more (the agent was killed or crashed).
                note(agent_gone(hello))
                return 3
            note("connection to the agent lost; the run goes on — retrying")
        except AgentNotResponding as e:
            # Its socket is there but it does not answer (stopped, wedged): waiting on it
            # would be a wait without a bound.  Say so and end; attach again once it answers.
            note(str(e))
            return e.exit_code
        except (ConnectionError, OSError) as e:
            if between_agents is not None and at.next_seq == 0:  # no agent began yet
                await client.close()
                if not await between_agents({"state": "PENDING"}):
                    return 3
                await asyncio.sleep(1.0)
                continue
            note(f"cannot reach the agent ({e}); retrying in {delay:.1f}s")
        finally:
            await client.close()
        now = loop.time()
        lost_since = lost_since if lost_since is not None else now
        if give_up_s is not None and now - lost_since > give_up_s:
            note(f"gave up after {give_up_s:.0f}s without the agent")
            return 3
        await asyncio.sleep(delay)
        delay = min(max_wait_s, delay * 2)
