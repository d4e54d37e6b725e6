"""Probes: the GPU (NVML, amdsmi, rocm-smi).

A probe's :meth:`read` is one :class:`GpuReading` of every device the tool sees, each
device's process list (pid, memory) and, where the driver gives it, each process's own
utilisation (NVML's ``nvmlDeviceGetProcessUtilization``, amdsmi's per-process gfx engine
time); rocm-smi's ``--showpids`` lists processes without their device (its "GPU(s)" column
is a count), so they are the reading's ``unplaced``.  Which of these devices are a run's is
decided in :mod:`trainctl.core.gpu_devices`.

Nothing here raises on a machine without a GPU: :func:`detect_gpu_probe` returns a
:class:`NoGpuProbe` that says why ("no NVIDIA driver (NVML: ...); no amdsmi; no rocm-smi
on PATH").  The parsers (:func:`parse_rocm_smi`, :func:`nvml_sample`,
:func:`amdsmi_sample`) are pure functions over a tool's output or an injected module, so
they are tested with recorded outputs (``tests/data/gpu/``) and fakes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from trainctl.system.process import ends_with_us


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one moment; a missing reading is None."""

    name: str | None
    util_percent: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    power_w: float | None
    temperature_c: float | None
    index: int = 0
    source: str = ""  # nvml | amdsmi | rocm-smi
    processes: tuple[tuple[int, int | None], ...] = ()  # (pid, GPU memory bytes)
    devices: int = 1  # how many GPUs the tool saw
    # (pid, % of the device's compute that pid used since the last reading); None: the
    # driver gives no per-process figure; () given, and no process used the device
    process_util: tuple[tuple[int, float], ...] | None = None
    uuid: str | None = None  # NVML's "GPU-..." / "MIG-..." (CUDA_VISIBLE_DEVICES may name it)

    def as_dict(self) -> dict[str, Any]:
        """The tick event's ``gpu`` dict (keys the TUI reads: name, util, mem_used, mem_total, power_w)."""
        return {
            "name": self.name,
            "util": self.util_percent,
            "mem_used": self.mem_used_bytes,
            "mem_total": self.mem_total_bytes,
            "power_w": self.power_w,
            "temperature_c": self.temperature_c,
            "index": self.index,
            "source": self.source,
            "devices": self.devices,
            "processes": [{"pid": p, "mem_used": m} for p, m in self.processes],
        }


@dataclass(frozen=True)
class GpuReading:
    """Every device one tool sees, at one moment."""

    devices: tuple[GpuSample, ...]
    source: str  # nvml | amdsmi | rocm-smi
    # processes the tool lists without saying on which device (rocm-smi --showpids)
    unplaced: tuple[tuple[int, int | None], ...] = ()


class GpuProbe(Protocol):
    def available(self) -> tuple[bool, str]: ...

    def sample(self) -> GpuSample | None: ...

    def read(self) -> GpuReading | None: ...


@dataclass
class NoGpuProbe:
    """No GPU tool answered; ``reason`` says what was tried."""

    reason: str = "no GPU probe"

    def available(self) -> tuple[bool, str]:
        return False, self.reason

    def sample(self) -> GpuSample | None:
        return None

    def read(self) -> GpuReading | None:
        return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text and text[0] else type(e).__name__


# ----- NVIDIA (nvidia-ml-py's ``pynvml``)


def nvml_sample(nvml: Any, index: int = 0, since_us: int | None = None) -> GpuSample:
    """Read one device through an initialised NVML module (real ``pynvml`` or a fake).
    Each reading that fails is None; a failing handle raises the module's error.
    ``since_us``: the per-process utilisation samples newer than this NVML timestamp
    (µs) are read (None: not asked)."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)

    def get(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception:  # noqa: BLE001 - any NVMLError (not supported, GPU lost, ...) → missing metric
            return None

    name = get(lambda: nvml.nvmlDeviceGetName(handle))
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    util = get(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
    mem = get(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    power_mw = get(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
    temp = get(lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
    count = get(nvml.nvmlDeviceGetCount)
    procs: dict[int, int | None] = {}
    for fn_name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        fn = getattr(nvml, fn_name, None)
        for p in (get(functools.partial(fn, handle)) if fn is not None else None) or ():
            pid = getattr(p, "pid", None)
            if isinstance(pid, int) and pid not in procs:
                used = getattr(p, "usedGpuMemory", None)
                procs[pid] = int(used) if isinstance(used, int) else None
    uuid = get(lambda: nvml.nvmlDeviceGetUUID(handle))
    if isinstance(uuid, bytes):
        uuid = uuid.decode(errors="replace")
    return GpuSample(
        name=name,
        util_percent=_num(getattr(util, "gpu", None)),
        mem_used_bytes=_int(getattr(mem, "used", None)),
        mem_total_bytes=_int(getattr(mem, "total", None)),
        power_w=None if (power := _num(power_mw)) is None else power / 1000.0,
        temperature_c=_num(temp),
        index=index,
        source="nvml",
        processes=tuple(sorted(procs.items())),
        devices=count if isinstance(count, int) else 1,
        process_util=None if since_us is None else nvml_process_util(nvml, handle, since_us),
        uuid=uuid if isinstance(uuid, str) else None,
    )


def nvml_process_util(nvml: Any, handle: Any, since_us: int) -> tuple[tuple[int, float], ...] | None:
    """(pid, SM %) of each process with a utilisation sample newer than ``since_us``, its
    newest; () when NVML has none (``NVML_ERROR_NOT_FOUND``: no process ran a kernel);
    None when the driver does not give per-process figures (not supported, no function)."""
    fn = getattr(nvml, "nvmlDeviceGetProcessUtilization", None)
    if fn is None:
        return None
    try:
        found = fn(handle, since_us)
    except Exception as e:  # noqa: BLE001 - NVMLError_NotFound: no sample; anything else: not given
        return () if "NotFound" in type(e).__name__ or "Not Found" in str(e) else None
    newest: dict[int, tuple[int, float]] = {}
    for u in found or ():
        pid, ts, sm = getattr(u, "pid", None), getattr(u, "timeStamp", 0), _num(getattr(u, "smUtil", None))
        if not isinstance(pid, int) or sm is None or not isinstance(ts, int) or ts <= since_us:
            continue
        if pid not in newest or ts > newest[pid][0]:
            newest[pid] = (ts, sm)
    return tuple(sorted((pid, sm) for pid, (_, sm) in newest.items()))


class NvmlProbe:
    """NVIDIA GPUs through NVML (``pynvml`` from nvidia-ml-py, imported lazily)."""

    def __init__(self, index: int = 0, nvml: Any = None) -> None:
        self.index = index
        self._nvml = nvml
        self._state: tuple[bool, str] | None = None
        self._since_us: dict[int, int] = {}  # device -> NVML time of the last utilisation read

    def available(self) -> tuple[bool, str]:
        if self._state is None:
            self._state = self._init()
        return self._state

    def _init(self) -> tuple[bool, str]:
        try:
            if self._nvml is None:
                import pynvml  # nvidia-ml-py

                self._nvml = pynvml
            self._nvml.nvmlInit()
            count = self._nvml.nvmlDeviceGetCount()
            if count <= self.index:
                return False, f"NVML sees {count} GPU(s), none with index {self.index}"
            self._nvml.nvmlDeviceGetHandleByIndex(self.index)
            return True, f"NVML: {count} GPU(s)"
        except ImportError as e:
            return False, f"nvidia-ml-py not installed ({_first_line(e)})"
        except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
            return False, f"no NVIDIA driver (NVML: {_first_line(e)})"

    def sample(self) -> GpuSample | None:
        if not self.available()[0]:
            return None
        try:
            return nvml_sample(self._nvml, self.index)
        except Exception:  # noqa: BLE001 - the handle's NVMLError (GPU lost, ...) → no sample
            return None

    def read(self) -> GpuReading | None:
        """Every device; a device whose handle fails (lost) is left out."""
        if not self.available()[0]:
            return None
        try:
            count = int(self._nvml.nvmlDeviceGetCount())
        except Exception:  # noqa: BLE001 - the driver gone since: no reading
            return None
        now_us = int(time.time() * 1e6)
        out = []
        for i in range(count):
            try:
                # the first read asks for the last second's samples, then those since the last
                out.append(nvml_sample(self._nvml, i, self._since_us.get(i, now_us - 1_000_000)))
            except Exception:  # noqa: BLE001 - the handle's NVMLError (GPU lost, ...)
                continue
            self._since_us[i] = now_us
        return GpuReading(tuple(out), "nvml")


# ----- AMD: amdsmi (Python bindings of AMD SMI, ROCm 6+)


def amdsmi_sample(
    amdsmi: Any,
    handle: Any,
    index: int = 0,
    devices: int = 1,
    gfx_before: dict[int, tuple[float, int]] | None = None,
    now: float | None = None,
) -> GpuSample:
    """Read one device through an initialised ``amdsmi`` module (real or fake).

    Units per the AMD SMI docs: VRAM in MB (MiB), power in W, temperature in °C; a
    value may be the string "N/A".  ``gfx_before``: pid -> (time, gfx engine ns) of the
    last reading, updated in place: each process's utilisation is its gfx engine time
    since then (None while no earlier reading, or the driver gives no engine time)."""

    def get(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception:  # noqa: BLE001 - amdsmi's AmdSmiException (not supported, ...) → missing metric
            return None

    asic = get(lambda: amdsmi.amdsmi_get_gpu_asic_info(handle)) or {}
    activity = get(lambda: amdsmi.amdsmi_get_gpu_activity(handle)) or {}
    vram = get(lambda: amdsmi.amdsmi_get_gpu_vram_usage(handle)) or {}
    power = get(lambda: amdsmi.amdsmi_get_power_info(handle)) or {}
    temp = get(
        lambda: amdsmi.amdsmi_get_temp_metric(
            handle, amdsmi.AmdSmiTemperatureType.EDGE, amdsmi.AmdSmiTemperatureMetric.CURRENT
        )
    )
    watts = _num(power.get("current_socket_power"))
    if watts is None:
        watts = _num(power.get("average_socket_power"))
    listed = amdsmi_processes(get(lambda: amdsmi.amdsmi_get_gpu_process_list(handle)) or ())
    procs = tuple((pid, vram) for pid, vram, _ in listed)
    process_util = None
    if gfx_before is not None and now is not None:
        process_util = engine_util(gfx_before, {pid: ns for pid, _, ns in listed}, now)
    mib = 1 << 20
    used, total = _num(vram.get("vram_used")), _num(vram.get("vram_total"))
    return GpuSample(
        name=asic.get("market_name") if isinstance(asic.get("market_name"), str) else None,
        util_percent=_num(activity.get("gfx_activity")),
        mem_used_bytes=None if used is None else int(used * mib),
        mem_total_bytes=None if total is None else int(total * mib),
        power_w=watts,
        temperature_c=_num(temp),
        index=index,
        source="amdsmi",
        processes=procs,
        devices=devices,
        process_util=process_util,
    )


def _amd_value(v: Any) -> int | None:
    """A figure of amdsmi's process list: an int, or ``{"value": 123, "unit": "B"}`` (the
    shape ``amd-smi process --json`` prints)."""
    return _int(v.get("value")) if isinstance(v, dict) else _int(v)


def amdsmi_processes(entries: Any) -> tuple[tuple[int, int | None, int | None], ...]:
    """(pid, VRAM bytes, gfx engine ns) of each entry of ``amdsmi_get_gpu_process_list``
    (ROCm 6.1+: dicts with ``pid``, ``memory_usage.vram_mem``, ``engine_usage.gfx``)."""
    out = []
    for p in entries if isinstance(entries, (list, tuple)) else ():
        if not isinstance(p, dict) or not isinstance(p.get("pid"), int):
            continue
        usage, engine = p.get("memory_usage"), p.get("engine_usage")
        vram = _amd_value(usage.get("vram_mem")) if isinstance(usage, dict) else None
        gfx = _amd_value(engine.get("gfx")) if isinstance(engine, dict) else None
        out.append((p["pid"], vram, gfx))
    return tuple(out)


def engine_util(
    before: dict[int, tuple[float, int]], now_ns: dict[int, int | None], now: float
) -> tuple[tuple[int, float], ...] | None:
    """Each process's % of the device since its last reading, from its cumulative engine
    time (ns); ``before`` is updated in place.  None when no process has an earlier
    reading with an engine time (nothing to compare yet, or not given)."""
    out = []
    for pid, ns in now_ns.items():
        if ns is None:
            continue
        prev = before.get(pid)
        before[pid] = (now, ns)
        if prev is not None and now > prev[0]:
            share = max(0.0, (ns - prev[1]) / ((now - prev[0]) * 1e9) * 100.0)
            out.append((pid, min(100.0, share)))
    for gone in set(before) - set(now_ns):
        del before[gone]
    return tuple(sorted(out)) if out else None


class AmdSmiProbe:
    """AMD GPUs through the ``amdsmi`` Python package (imported lazily)."""

    def __init__(self, index: int = 0, amdsmi: Any = None) -> None:
        self.index = index
        self._mod = amdsmi
        self._handles: list[Any] = []
        self._state: tuple[bool, str] | None = None
        self._gfx: dict[int, dict[int, tuple[float, int]]] = {}  # device -> pid -> (t, ns)

    def available(self) -> tuple[bool, str]:
        if self._state is None:
            self._state = self._init()
        return self._state

    def _init(self) -> tuple[bool, str]:
        try:
            if self._mod is None:
                import amdsmi  # type: ignore[import-not-found]

                self._mod = amdsmi
            self._mod.amdsmi_init()
            self._handles = list(self._mod.amdsmi_get_processor_handles())
        except ImportError:
            return False, "no amdsmi Python package"
        except Exception as e:  # noqa: BLE001 - AmdSmiLibraryException (no driver, ...) → unavailable
            return False, f"amdsmi: {_first_line(e)}"
        if len(self._handles) <= self.index:
            return False, f"amdsmi sees {len(self._handles)} GPU(s), none with index {self.index}"
        return True, f"amdsmi: {len(self._handles)} GPU(s)"

    def sample(self) -> GpuSample | None:
        if not self.available()[0]:
            return None
        try:
            return amdsmi_sample(self._mod, self._handles[self.index], self.index, len(self._handles))
        except Exception:  # noqa: BLE001 - amdsmi's error (GPU gone, ...) → no sample
            return None

    def read(self) -> GpuReading | None:
        if not self.available()[0]:
            return None
        out = []
        now = time.monotonic()
        for i, handle in enumerate(self._handles):
            try:
                before = self._gfx.setdefault(i, {})
                out.append(amdsmi_sample(self._mod, handle, i, len(self._handles), before, now))
            except Exception:  # noqa: BLE001 - amdsmi's error (GPU gone, ...)
                continue
        return GpuReading(tuple(out), "amdsmi")


# ----- AMD: the rocm-smi command line

ROCM_SMI_ARGS = (
    "--showuse",
    "--showmemuse",
    "--showpower",
    "--showmeminfo",
    "vram",
    "--showtemp",
    "--showproductname",
    "--showpids",
    "--json",
)

# key names differ between rocm-smi versions (see tests/data/gpu/): matched case-insensitively
_UTIL_KEYS = ("gpu use (%)",)
_POWER_KEYS = (
    "average graphics package power (w)",
    "current socket graphics package power (w)",
    "current graphics package power (w)",
)
_TEMP_KEYS = ("temperature (sensor edge) (c)", "temperature (sensor junction) (c)")
_VRAM_USED = ("vram total used memory (b)",)
_VRAM_TOTAL = ("vram total memory (b)",)
_NAME_KEYS = ("device name", "card series", "card model")
_CARD = re.compile(r"^card(\d+)$")


def parse_rocm_smi(text: str, index: int = 0) -> GpuSample | None:
    """Parse ``rocm-smi ... --json`` output (anything before the first ``{`` is skipped:
    some versions print warnings first): card ``index``, with every process
    ``--showpids`` listed (it does not say which card).  None when the card is not in it."""
    reading = parse_rocm_smi_reading(text)
    for card in reading.devices if reading is not None else ():
        if card.index == index:
            return dataclasses.replace(card, processes=reading.unplaced if reading else ())
    return None


def parse_rocm_smi_reading(text: str) -> GpuReading | None:
    """Every card of ``rocm-smi ... --json`` output; the ``--showpids`` processes are the
    reading's ``unplaced`` (rocm-smi gives a process's GPU count, not its cards).  None
    when the text holds no JSON object."""
    start = text.find("{")
    if start < 0:
        return None
    try:
        data = json.loads(text[start:])
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    cards = {int(m.group(1)): v for k, v in data.items() if (m := _CARD.match(k)) and isinstance(v, dict)}
    samples = tuple(_rocm_card(card, index, len(cards)) for index, card in sorted(cards.items()))
    return GpuReading(samples, "rocm-smi", _rocm_pids(data.get("system")))


def _rocm_card(card: dict[str, Any], index: int, count: int) -> GpuSample:
    low = {str(k).strip().lower(): v for k, v in card.items()}

    def pick(keys: Sequence[str]) -> float | None:
        for k in keys:
            v = _num(low.get(k))
            if v is not None:
                return v
        return None

    name = None
    for k in _NAME_KEYS:
        v = low.get(k)
        if isinstance(v, str) and v.strip() and v.strip().upper() != "N/A":
            name = v.strip()
            break
    used, total = pick(_VRAM_USED), pick(_VRAM_TOTAL)
    return GpuSample(
        name=name,
        util_percent=pick(_UTIL_KEYS),
        mem_used_bytes=None if used is None else int(used),
        mem_total_bytes=None if total is None else int(total),
        power_w=pick(_POWER_KEYS),
        temperature_c=pick(_TEMP_KEYS),
        index=index,
        source="rocm-smi",
        devices=count,
    )


def _rocm_pids(system: Any) -> tuple[tuple[int, int | None], ...]:
    """``--showpids --json``: ``"system": {"PID1234": "python3, 1, 4203741184, 0, 0"}``
    (name, GPU count, VRAM bytes, SDMA, CU occupancy)."""
    if not isinstance(system, dict):
        return ()
    out = []
    for k, v in system.items():
        m = re.fullmatch(r"PID(\d+)", str(k))
        if not m:
            continue
        parts = [p.strip() for p in str(v).split(",")]
        vram = _int(_num(parts[2])) if len(parts) > 2 else None
        out.append((int(m.group(1)), vram))
    return tuple(sorted(out))


_PIDS_ROW = re.compile(r"^\s*(\d+)\s+(\S.*?)\s+(\d+)\s+(\d+|UNKNOWN)\s+(\d+|UNKNOWN)\s+(\d+|UNKNOWN)\s*$")


def parse_rocm_smi_pids_text(text: str) -> tuple[tuple[int, int | None], ...]:
    """(pid, VRAM bytes) of each row of ``rocm-smi --showpids`` as text (the "KFD process
    information" table: PID, name, GPU count, VRAM, SDMA, CU occupancy; "UNKNOWN" where
    the driver does not say, as on a process that cannot see every GPU).  A pid listed
    twice (``--showpids=details``: once per card) has its VRAM summed."""
    table = False
    out: dict[int, int | None] = {}
    for line in text.splitlines():
        if line.strip().startswith("PID") and "VRAM" in line:
            table = True
            continue
        if not table or line.lstrip().startswith("="):
            table = table and not line.lstrip().startswith("=")
            continue
        m = _PIDS_ROW.match(line.replace("\t", " "))
        if not m:
            continue
        pid, vram = int(m.group(1)), None if m.group(4) == "UNKNOWN" else int(m.group(4))
        if pid in out:
            held = out[pid]
            out[pid] = None if held is None or vram is None else held + vram
        else:
            out[pid] = vram
    return tuple(sorted(out.items()))


class RocmSmiProbe:
    """AMD GPUs through ``rocm-smi --json`` (about 0.3–1 s per call: sample sparingly)."""

    def __init__(
        self,
        index: int = 0,
        exe: str | None = None,
        run: Callable[[Sequence[str]], str] | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.index = index
        self.exe = exe or shutil.which("rocm-smi")
        self.timeout = timeout
        self._run = run or self._subprocess
        self._state: tuple[bool, str] | None = None

    def _subprocess(self, argv: Sequence[str]) -> str:
        r = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=self.timeout,
            stdin=subprocess.DEVNULL,
            preexec_fn=ends_with_us(),
        )
        return r.stdout

    def available(self) -> tuple[bool, str]:
        if self._state is None:
            if self.exe is None:
                self._state = (False, "no rocm-smi on PATH")
            else:
                self._state = (
                    (True, f"rocm-smi at {self.exe}")
                    if self._read() is not None
                    else (False, f"rocm-smi ({self.exe}) reports no card {self.index}")
                )
        return self._state

    def _read(self) -> GpuSample | None:
        try:
            return parse_rocm_smi(self._run([self.exe or "rocm-smi", *ROCM_SMI_ARGS]), self.index)
        except (OSError, subprocess.SubprocessError, ValueError):
            return None

    def sample(self) -> GpuSample | None:
        if not self.available()[0]:
            return None
        return self._read()

    def read(self) -> GpuReading | None:
        """Every card, in one call; where the JSON has no process section at all (a
        version that prints the table as text only), the text ``--showpids`` table's."""
        if not self.available()[0]:
            return None
        try:
            raw = self._run([self.exe or "rocm-smi", *ROCM_SMI_ARGS])
            reading = parse_rocm_smi_reading(raw)
            if reading is not None and not reading.unplaced and '"system"' not in raw:
                pids = parse_rocm_smi_pids_text(self._run([self.exe or "rocm-smi", "--showpids"]))
                reading = dataclasses.replace(reading, unplaced=pids)
            return reading
        except (OSError, subprocess.SubprocessError, ValueError):
            return None


def detect_gpu_probe(index: int = 0) -> GpuProbe:
    """The first GPU probe that works here (NVML, amdsmi, rocm-smi), else a
    :class:`NoGpuProbe` whose reason lists what was tried.  Never raises."""
    reasons: list[str] = []
    for make in (NvmlProbe, AmdSmiProbe, RocmSmiProbe):
        try:
            probe = make(index)
            ok, why = probe.available()
        except Exception as e:  # noqa: BLE001 - a broken tool must not break the agent
            ok, why = False, f"{make.__name__}: {_first_line(e)}"
        if ok:
            return probe
        reasons.append(why)
    return NoGpuProbe("; ".join(reasons))


# ---------------------------------------------------------------------------- helpers


def _num(v: Any) -> float | None:
    """A finite number from an int, float or numeric string ("34.0", "45 W"); else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        f = float(v)
    elif isinstance(v, str):
        m = re.match(r"\s*(-?\d+(?:\.\d+)?)", v)
        if not m:
            return None
        f = float(m.group(1))
    else:
        return None
    return f if f == f and f not in (float("inf"), float("-inf")) else None


def _int(v: Any) -> int | None:
    f = _num(v)
    return None if f is None else int(f)


__all__ = [
    "GpuReading",
    "parse_rocm_smi_reading",
    "parse_rocm_smi_pids_text",
    "amdsmi_processes",
    "engine_util",
    "nvml_process_util",
    "GpuSample",
    "GpuProbe",
    "NoGpuProbe",
    "NvmlProbe",
    "AmdSmiProbe",
    "RocmSmiProbe",
    "parse_rocm_smi",
    "nvml_sample",
    "amdsmi_sample",
    "detect_gpu_probe",
    "ROCM_SMI_ARGS",
]
