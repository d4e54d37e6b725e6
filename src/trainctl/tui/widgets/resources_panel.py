"""CPU and memory of the trainer and each worker, and the GPU (or "no GPU").  A torchrun
job shows a row per rank instead: its batch, rate, state and CPU (its DataLoader workers
included), the culprit of a stall marked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from trainctl.core.gpu_text import gpu_model_line, gpu_row
from trainctl.tui import fmt

MAX_ROWS = 6
MAX_GPU_ROWS = 4  # device rows of the run (8 GPUs of a torchrun node: 4 and "… 4 more")


@dataclass(frozen=True)
class ResourcesInfo:
    processes: tuple[dict[str, Any], ...] = ()
    gpu: dict[str, Any] | None = None
    known: bool = False  # False until the first tick
    wide: bool = True
    ended: str | None = None  # a final state: the last tick's processes are gone
    ranks: tuple = ()  # torchrun: tui.model.RankRow per rank
    stuck: tuple[int, ...] = ()  # the culprit ranks of the current stall


STATUS = {
    "running": "R",
    "sleeping": "S",
    "disk-sleep": "D",
    "stopped": "T",
    "zombie": "Z",
    "idle": "I",
    "tracing-stop": "t",
    "dead": "X",
}


def gpu_line(gpu: dict[str, Any] | None) -> str:
    if not gpu:
        return "no GPU"
    mem = ""
    if gpu.get("mem_used") is not None:
        mem = f" · mem {fmt.size(gpu['mem_used'])}/{fmt.size(gpu.get('mem_total'))}"
    power = f" · {gpu['power_w']:.0f} W" if gpu.get("power_w") is not None else ""
    return f"GPU {gpu.get('name') or ''} util {fmt.percent(gpu.get('util'))}{mem}{power}"


def gpu_lines(gpu: dict[str, Any] | None, wide: bool, text: Text) -> None:
    """A row per device of the run (agent/gpus.py: ``devices``; at most MAX_GPU_ROWS, the
    rest counted), else the one GPU line of an older agent's tick, or "no GPU"."""
    if gpu is None or "devices" not in gpu:
        text.append(gpu_line(gpu), style="" if gpu else "dim")
        return
    devices = gpu["devices"] if isinstance(gpu["devices"], list) else []
    if not devices:
        text.append(f"no GPU of the run ({gpu.get('why') or 'none read'})", style="dim")
        return
    rows = [f"gpu {d.get('index', '?')} {gpu_row(d, wide, named=False)}" for d in devices[:MAX_GPU_ROWS]]
    text.append("\n".join(rows))
    if len(devices) > MAX_GPU_ROWS:
        text.append(f"\n… {len(devices) - MAX_GPU_ROWS} more GPUs", style="dim")


def rank_lines(info: ResourcesInfo, text: Text) -> None:
    """A row per rank: batch, rate, state, CPU and workers (from the tick's processes)."""
    cpu: dict[int, float] = {}
    workers: dict[int, int] = {}
    status: dict[int, str] = {}
    for proc in info.processes:
        rank = proc.get("rank")
        if not isinstance(rank, int):
            continue
        cpu[rank] = cpu.get(rank, 0.0) + float(proc.get("cpu_percent") or 0.0)
        if proc.get("role") == "worker":
            workers[rank] = workers.get(rank, 0) + 1
        else:
            status[rank] = str(proc.get("status") or "?")
    rows = {r.rank: r for r in info.ranks}
    for rank in sorted(set(rows) | set(status))[:MAX_ROWS]:
        row = rows.get(rank)
        stuck = rank in info.stuck
        batch = f"{fmt.count(row.batch)}/{fmt.count(row.batches)}" if row else "—"
        ep = f"e{row.epoch} " if row and row.epoch is not None else ""
        rate = f"{row.rate:.2f} it/s" if row and row.rate is not None else "— it/s"
        state = "STUCK" if stuck else STATUS.get(status.get(rank, ""), "gone" if rank not in status else "?")
        use = f"cpu {fmt.percent(cpu.get(rank))}" if rank in status else "cpu —"
        more = f" +{workers[rank]}w" if workers.get(rank) and info.wide else ""
        text.append(
            f"{'▶' if stuck else ' '}rank {rank:<3} {ep}{batch:<9} {rate:>10} {state:<5} {use}{more}\n",
            style="bold red" if stuck else "",
        )


def gpu_row_count(gpu: dict[str, Any] | None) -> int:
    """The lines :func:`gpu_lines` takes."""
    devices = gpu.get("devices") if gpu else None
    if not isinstance(devices, list) or not devices:
        return 1
    return min(len(devices), MAX_GPU_ROWS) + (1 if len(devices) > MAX_GPU_ROWS else 0)


def resources_text(info: ResourcesInfo, height: int | None = None) -> Text:
    """``height``: the panel's lines; the GPU rows keep theirs, the process rows get the
    rest (the others counted)."""
    if info.ended:
        return Text(f"run {info.ended}: no trainer process", style="dim")
    if not info.known:
        return Text("waiting for the agent's probes…", style="dim")
    text = Text()
    if info.ranks or any("rank" in p for p in info.processes):
        rank_lines(info, text)
        gpu_lines(info.gpu, info.wide, text)
        return text
    procs = info.processes
    shown = MAX_ROWS
    if height is not None and height > 0:
        room = height - gpu_row_count(info.gpu)
        shown = min(MAX_ROWS, max(1, room if len(procs) <= room else room - 1))
    for proc in procs[:shown]:
        role = str(proc.get("role") or "?")
        style = "bold" if role == "main" else ""
        status = str(proc.get("status") or "?")
        cpu, rss = fmt.percent(proc.get("cpu_percent")), fmt.size(proc.get("rss_bytes"))
        if info.wide:
            text.append(
                f"{role:<6} {proc.get('pid', '?'):>7} {status:<8.8} cpu {cpu:>4} "
                f"rss {rss:>9} thr {proc.get('num_threads') or '—'}\n",
                style=style,
            )
        else:
            text.append(
                f"{role:<6} {proc.get('pid', '?'):>7} {STATUS.get(status, '?')} {cpu:>5} {rss:>9}\n",
                style=style,
            )
    if len(procs) > shown:
        text.append(f"… {len(procs) - shown} more processes\n", style="dim")
    if not procs:
        text.append("no trainer process\n", style="dim")
    gpu_lines(info.gpu, info.wide, text)
    return text


class ResourcesPanel(Static):
    info: reactive[ResourcesInfo] = reactive(ResourcesInfo, init=False)

    def on_mount(self) -> None:
        self.border_title = "Resources"
        self.watch_info(self.info)

    def watch_info(self, info: ResourcesInfo) -> None:
        title = "Ranks" if info.ranks and not info.ended else "Resources"
        devices = info.gpu.get("devices") if info.gpu and not info.ended else None
        if isinstance(devices, list) and devices:  # the run's GPUs' model, once (narrow: alone)
            title = f"{title} · {gpu_model_line(devices)}" if info.wide else gpu_model_line(devices)
        self.border_title = title
        self.update(resources_text(info, self.content_size.height or None))

    def on_resize(self) -> None:
        self.watch_info(self.info)
