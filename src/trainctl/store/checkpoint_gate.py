"""May this checkpoint be unpickled?  The gate in front of every ``torch.load``.

Unpickling runs whatever callables a pickle names (``os.system``, ``builtins.eval``...), so
a checkpoint is judged by the globals its pickles import, listed from their opcodes with
:mod:`pickletools`: nothing in the file is executed, nothing is imported.  Every pickle
torch would read is listed: each ``*.pkl`` member of a torch zip, the leading pickles of a
legacy (non-zip) torch file, or a plain pickle.  A global is named by ``GLOBAL`` / ``INST``
(``module name`` in the opcode) or ``STACK_GLOBAL`` (the two strings pushed right before
it, followed through the memo), and judged as the unpickler imports it (Python 2 names
mapped); a name that is not a string literal, or an extension-registry code (``EXT1/2/4``),
is refused as unnamed.

Two rules:

* :func:`checkpoint_refusal`, for a file trainctl itself (or its Ultralytics runner)
  unpickles: every global must be one of :data:`ALLOWED`, the exact ``module.qualname``
  names seen in real checkpoints of the supported Ultralytics and torch versions (made
  again and checked by tests/unit/test_checkpoint_gate.py and
  tests/e2e/test_checkpoint_gate.py).  :func:`load_checkpoint` then loads it with
  ``weights_only=True`` and those classes as safe globals (torch >= 2.4; on older torch the
  scan alone decides).
* :func:`script_checkpoint_refusal`, for a file the user's own script loads itself (a plain
  command's ``--resume-from``, the files a script writes): refused only for a global that
  executes code (:data:`CODE_MODULES`, :data:`CODE_NAMES`); any other class passes, since
  scripts save ``argparse.Namespace`` and their libraries' own classes.

A file the user trusts (``--trust-checkpoint PATH``, the job's ``trust_checkpoints``) is
never refused: see docs/security.md.
"""

from __future__ import annotations

import os
import pickletools
import typing
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ALLOWED",
    "CODE_MODULES",
    "CODE_NAMES",
    "GateRefusal",
    "PickleGlobals",
    "Trusted",
    "checkpoint_refusal",
    "file_globals",
    "is_trusted",
    "load_checkpoint",
    "pickle_globals",
    "python3_name",
    "script_checkpoint_refusal",
]

# The globals of real checkpoints, exact ``module.qualname``, as recorded here with torch
# 2.14 and Ultralytics 8.4: a YOLOv8n and a YOLO11n trained from YAML (last.pt, best.pt,
# last_good.pt, trainctl's mid-epoch saves) and a plain loop's model, optimizer (SGD, Adam,
# AdamW), LR scheduler and GradScaler state dicts (tests/unit/test_checkpoint_gate.py makes
# them again and checks that none is refused).  All are classes but the three functions a
# torch.save needs for every tensor: torch._utils._rebuild_tensor_v2 / _v3 and
# _rebuild_parameter.
ALLOWED: frozenset[str] = frozenset(
    {
        # torch: tensors, parameters, storages, dtypes, sizes
        "torch._utils._rebuild_tensor_v2",  # function: every tensor
        "torch._utils._rebuild_tensor_v3",  # function: a tensor of a dtype with no typed storage (uint32)
        "torch._utils._rebuild_parameter",  # function: every nn.Parameter
        "torch.storage.UntypedStorage",
        "torch.FloatStorage",
        "torch.HalfStorage",
        "torch.LongStorage",
        "torch.ByteStorage",
        "torch.Size",
        "torch.uint32",  # numpy's RNG keys in trainctl's mid-epoch saves
        "collections.OrderedDict",
        "builtins.set",  # written __builtin__.set by pickle protocol 2
        # torch.nn modules of YOLOv8 and YOLO11
        "torch.nn.modules.activation.SiLU",
        "torch.nn.modules.batchnorm.BatchNorm2d",
        "torch.nn.modules.container.ModuleList",
        "torch.nn.modules.container.Sequential",
        "torch.nn.modules.conv.Conv2d",
        "torch.nn.modules.linear.Identity",
        "torch.nn.modules.pooling.MaxPool2d",
        "torch.nn.modules.upsampling.Upsample",
        # Ultralytics 8.4: the detection model and its blocks
        "ultralytics.nn.tasks.DetectionModel",
        "ultralytics.nn.modules.block.Attention",
        "ultralytics.nn.modules.block.Bottleneck",
        "ultralytics.nn.modules.block.C2PSA",
        "ultralytics.nn.modules.block.C2f",
        "ultralytics.nn.modules.block.C3k",
        "ultralytics.nn.modules.block.C3k2",
        "ultralytics.nn.modules.block.DFL",
        "ultralytics.nn.modules.block.PSABlock",
        "ultralytics.nn.modules.block.SPPF",
        "ultralytics.nn.modules.conv.Concat",
        "ultralytics.nn.modules.conv.Conv",
        "ultralytics.nn.modules.conv.DWConv",
        "ultralytics.nn.modules.head.Detect",
        "ultralytics.utils.IterableSimpleNamespace",
    }
)

# Globals that execute code, import it, or reach the shell, the network or files: refused
# even in a script's own checkpoint (the kind of list picklescan keeps).  Modules whose
# classes are plain values in scripts' checkpoints (pathlib's paths, functools.partial)
# are not here.  A module here refuses every name in it (and in its
# submodules); CODE_NAMES are single names of modules that are otherwise harmless.
CODE_MODULES: frozenset[str] = frozenset(
    {
        "os",
        "posix",
        "nt",
        "posixpath",
        "ntpath",
        "subprocess",
        "pty",
        "runpy",
        "importlib",
        "pkgutil",
        "zipimport",
        "imp",
        "pickle",
        "_pickle",
        "marshal",
        "dill",
        "cloudpickle",
        "shelve",
        "ctypes",
        "_ctypes",
        "cffi",
        "shutil",
        "sys",
        "code",
        "codeop",
        "pdb",
        "bdb",
        "webbrowser",
        "socket",
        "_socket",
        "asyncio",
        "multiprocessing",
        "signal",
        "mmap",
        "fcntl",
        "resource",
        "commands",
        "popen2",
        "timeit",
        "trace",
        "cProfile",
        "profile",
        "doctest",
        "inspect",
        "types",
        "operator",
        "_operator",
        "urllib",
        "http",
        "ftplib",
        "smtplib",
        "telnetlib",
        "requests",
        "aiohttp",
        "httpx",
    }
)
CODE_NAMES: frozenset[str] = frozenset(
    {
        "builtins.eval",
        "builtins.exec",
        "builtins.compile",
        "builtins.getattr",
        "builtins.setattr",
        "builtins.delattr",
        "builtins.__import__",
        "builtins.open",
        "io.open",
        "io.open_code",
        "_io.open",
        "_io.open_code",
        "_io.FileIO",
        "io.FileIO",
        "platform.popen",
        "threading.Thread",
        "_thread.start_new_thread",
        "builtins.input",
        "builtins.breakpoint",
        "builtins.globals",
        "builtins.locals",
        "builtins.vars",
        "builtins.__builtins__",
        "torch.load",
        "torch.jit.load",
        "torch.hub.load",
        "torch.serialization.load",
        "torch.utils.cpp_extension.load",
        "torch.utils.cpp_extension.load_inline",
        "numpy.load",
        "numpy.testing._private.utils.runstring",
        "numpy.f2py.crackfortran.getlincoef",
        "numpy.f2py.crackfortran._eval_length",
        "numpy.f2py.crackfortran.myeval",
        "numpy.f2py.crackfortran._eval_scalar",
        "numpy.distutils.misc_util.exec_command",
        "numpy.distutils.exec_command.exec_command",
        "numpy.distutils.exec_command._exec_command",
        "pandas.read_pickle",
        "joblib.load",
    }
)

Trusted = typing.Collection[typing.Union[str, "os.PathLike[str]"]]
"""The files the user trusts (``--trust-checkpoint``, the job's ``trust_checkpoints``).
(typing's generics: an alias is evaluated, and this runs on Python 3.8 inside the trainer.)"""

_ZIP_MAGIC = b"PK\x03\x04"
_LEGACY_PICKLES = 5  # torch's legacy format: magic, protocol, sys info, the object, storage keys
_STRINGS = {
    "BINUNICODE",
    "SHORT_BINUNICODE",
    "UNICODE",
    "BINUNICODE8",
    "BINSTRING",
    "SHORT_BINSTRING",
    "STRING",
    "BINBYTES",
    "SHORT_BINBYTES",
    "BINBYTES8",
}
_MEMO_PUT = {"BINPUT", "LONG_BINPUT", "PUT"}
_MEMO_GET = {"BINGET", "LONG_BINGET", "GET"}


class GateRefusal(Exception):
    """The file may not be unpickled; ``str()`` names the global and where."""


class _Unnamed:
    """A value the lister does not follow (only strings matter to it)."""


_UNNAMED = _Unnamed()


@dataclass(frozen=True)
class PickleGlobals:
    """What one pickle imports: ``names`` (``module.qualname``, in order; a name that is
    not a string literal, or an extension code, as ``<...>``: never allowed by either rule)
    and, for a pickle that breaks before its STOP, ``damage`` (what broke; the names are
    those before it: unpickling runs them before it meets the damage)."""

    where: str
    names: tuple[str, ...]
    damage: str | None = None


def pickle_globals(data: Any, where: str = "pickle") -> PickleGlobals:
    """The globals one pickle imports (``data``: bytes, or a file positioned at the
    pickle's start, left just after its STOP).  Executes nothing, imports nothing.

    ``STACK_GLOBAL`` takes the two values on top of the stack: they are known only when
    the two opcodes that pushed last are string literals or memo reads of one, with
    nothing but memo writes after them (how pickle writes a global); ``recent`` holds
    those pushes and any other opcode empties it, so a name is never guessed."""
    memo: dict[int, Any] = {}
    recent: list[Any] = []  # the latest pushes, while nothing else touched the stack
    found: list[str] = []
    try:
        for op, arg, _pos in pickletools.genops(data):
            name = op.name
            if name in _STRINGS:
                recent.append(arg.decode("latin-1") if isinstance(arg, bytes) else arg)
            elif name in _MEMO_GET:
                assert arg is not None  # the memo opcodes always carry their index
                recent.append(memo.get(int(arg), _UNNAMED))
            elif name in _MEMO_PUT or name == "MEMOIZE":
                index = len(memo) if name == "MEMOIZE" else int(arg)  # type: ignore[arg-type]
                memo[index] = recent[-1] if recent else _UNNAMED
            elif name == "STACK_GLOBAL":
                under, top = ([_UNNAMED, _UNNAMED] + recent)[-2:]
                named = isinstance(under, str) and isinstance(top, str)
                found.append(
                    f"{under}.{top}" if named else "<a STACK_GLOBAL whose name is not a string literal>"
                )
                recent = []
            elif name in ("GLOBAL", "INST"):
                module, _, qualname = str(arg).partition(" ")
                found.append(f"{module}.{qualname}")
                recent = []
            elif name in ("EXT1", "EXT2", "EXT4"):
                found.append(f"<extension code {arg} (copyreg's registry)>")
                recent = []
            elif name == "STOP":
                break
            elif recent and name not in ("FRAME", "PROTO"):  # those two leave the stack alone
                recent = []
    except Exception as exc:  # noqa: BLE001 - any malformed pickle is just "damaged"
        return PickleGlobals(where, tuple(found), f"{type(exc).__name__}: {exc}")
    return PickleGlobals(where, tuple(found))


def file_globals(path: str | os.PathLike[str]) -> list[PickleGlobals]:
    """The globals of every pickle torch.load would read in ``path``: each ``*.pkl`` member
    of a zip; else the leading pickles of a legacy torch file (at most five; the first of
    a plain pickle file).  Raises GateRefusal for a file that cannot be read."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            if f.read(4) != _ZIP_MAGIC:
                f.seek(0)
                return _leading_pickles(f)
        with zipfile.ZipFile(path) as zf:
            members = [n for n in zf.namelist() if n.endswith(".pkl")]
            if not members:
                raise GateRefusal("a zip archive with no pickle in it: not a torch checkpoint")
            return [pickle_globals(zf.read(m), m) for m in members]
    except (zipfile.BadZipFile, EOFError, ValueError) as exc:
        raise GateRefusal(f"unreadable zip archive: {exc}") from None
    except OSError as exc:
        raise GateRefusal(f"cannot read: {exc.strerror or exc}") from None


def _leading_pickles(f: Any) -> list[PickleGlobals]:
    """torch's legacy loader unpickles a magic number, then (only if it matched) the
    protocol, the system info, the object and its storage keys, then reads raw bytes."""
    out = [pickle_globals(f, "pickle 1 at byte 0")]
    if out[0].damage is not None:
        return out
    for index in range(1, _LEGACY_PICKLES):
        start = f.tell()
        if not f.read(1):
            break  # a plain pickle file: one pickle, then its end
        f.seek(start)
        out.append(pickle_globals(f, f"pickle {index + 1} at byte {start}"))
        if out[-1].damage is not None:
            break
    return out


def is_trusted(path: str | os.PathLike[str], trusted: Trusted) -> bool:
    """``path`` is one of the files the user trusts (compared resolved)."""
    real = os.path.realpath(path)
    return any(os.path.realpath(t) == real for t in trusted)


def python3_name(name: str) -> str:
    """The global an unpickler imports for ``name`` as written: pickle maps Python 2's
    names (``__builtin__.exec``, ``cPickle.loads``, ``commands.getoutput``) to Python 3's
    for protocols 0-2, so a name is judged as it will be imported."""
    from _compat_pickle import IMPORT_MAPPING, NAME_MAPPING

    module, _, qualname = name.rpartition(".")
    if (module, qualname) in NAME_MAPPING:
        module, qualname = NAME_MAPPING[(module, qualname)]
    elif module in IMPORT_MAPPING:
        module = IMPORT_MAPPING[module]
    return f"{module}.{qualname}" if module else name


def _first_refused(pickles: list[PickleGlobals], refuse: Callable[[str], bool]) -> str | None:
    for pickle in pickles:
        for name in pickle.names:
            if refuse(python3_name(name)):
                return f"its pickle ({pickle.where}) imports {name}"
    return None


def checkpoint_refusal(path: str | os.PathLike[str], trusted: Trusted = ()) -> str | None:
    """Why trainctl may not unpickle ``path``, one line naming the global (one not in
    ALLOWED) or the damage; None when it may."""
    if is_trusted(path, trusted):
        return None
    try:
        pickles = file_globals(path)
    except GateRefusal as exc:
        return f"refused by the checkpoint gate: {exc}"
    why = _first_refused(pickles, lambda name: name not in ALLOWED)
    if why is not None:
        return f"{why}, which no checkpoint trainctl knows has: {_REFUSED}"
    damaged = next((p for p in pickles if p.damage), None)
    if damaged is not None:
        return f"refused by the checkpoint gate: damaged pickle ({damaged.where}): {damaged.damage}"
    return None


def script_checkpoint_refusal(path: str | os.PathLike[str]) -> str | None:
    """Why a checkpoint the user's own script loads must not be given to it: one line
    naming a global that executes code; None when it may.  A directory (Hugging Face,
    DeepSpeed) is judged by its files; a file with no pickle in it (safetensors, JSON)
    and a damaged one (the completeness check's business) have nothing to refuse."""
    path = Path(path)
    if path.is_dir():
        for member in sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in _PICKLE_SUFFIXES):
            why = _code_refusal(member)
            if why is not None:
                return f"{member.relative_to(path)}: {why}"
        return None
    return _code_refusal(path)


def _code_refusal(path: Path) -> str | None:
    if path.suffix in (".safetensors", ".json"):
        return None
    try:
        pickles = file_globals(path)
    except GateRefusal:
        return None
    why = _first_refused(pickles, _executes_code)
    return None if why is None else f"{why}, which runs code when it is loaded: {_REFUSED}"


_REFUSED = "refused (a file of your own: --trust-checkpoint PATH; see docs/security.md)"
_PICKLE_SUFFIXES = {".pt", ".pth", ".bin", ".ckpt", ".tar", ".pkl", ".pickle"}


def _executes_code(name: str) -> bool:
    if name.startswith("<") or name in CODE_NAMES:
        return True
    module = name.rpartition(".")[0]
    while module:
        if module in CODE_MODULES:
            return True
        module = module.rpartition(".")[0]
    return False


def load_checkpoint(path: str | os.PathLike[str], trusted: Trusted = ()) -> Any:
    """``torch.load`` a checkpoint that passed :func:`checkpoint_refusal` (on CPU):
    ``weights_only=True`` with its classes as safe globals where torch has them (>= 2.4),
    else the scan alone decided.  A trusted file is loaded in full.  Raises GateRefusal
    for a file the gate refuses; whatever torch.load raises otherwise."""
    import torch

    why = checkpoint_refusal(path, trusted)
    if why is not None:
        raise GateRefusal(why)
    if is_trusted(path, trusted) or not hasattr(torch.serialization, "safe_globals"):
        return torch.load(path, map_location="cpu", weights_only=False)
    names = {python3_name(name) for pickle in file_globals(path) for name in pickle.names}
    # Classes and functions; a dtype (torch.uint32) is no class, and torch allows dtypes itself.
    objects = [obj for obj in map(_resolve, sorted(names)) if hasattr(obj, "__qualname__")]
    with torch.serialization.safe_globals(objects):
        return torch.load(path, map_location="cpu", weights_only=True)


def _resolve(name: str) -> Any:
    """The object an allowed ``module.qualname`` names (its module imported: it is one of
    ALLOWED, so torch's, collections' or Ultralytics')."""
    import importlib

    assert name in ALLOWED, name
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise GateRefusal(f"{name}: cannot be imported here")
