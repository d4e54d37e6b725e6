"""Checkpoint checks: is this ``last.pt`` whole and resumable, and keep a good copy.

Ultralytics writes ``last.pt`` in place (truncate, then write), so a kill during the
write leaves a truncated file.  The runner copies each new ``last.pt`` to a temporary
file, checks it and renames it to ``last_good.pt``; a restart resumes from the newest
checkpoint that passes.

Two depths of check:

* the default (``load=False``) needs neither torch nor ultralytics, so the agent can use
  it: the file is a complete zip archive whose CRCs match, and its ``data.pkl`` is read
  *without executing it* (a pickle opcode walk) for ``epoch``, ``optimizer`` and
  ``train_args.epochs``;
* ``load=True`` (the runner, where torch is already imported) also ``torch.load``s it.

Either way the checkpoint gate (checkpoint_gate.py) judges the file first: a pickle that
imports anything not seen in real checkpoints is refused, naming it, and never loaded;
only a file that passes it is called "resumable".
"""

from __future__ import annotations

import os
import pickletools
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainctl.core.statefile import fsync_dir, temp_beside
from trainctl.store.checkpoint_gate import GateRefusal, Trusted, checkpoint_refusal, load_checkpoint
from trainctl.store.checkpoint_verify import Unloadable, read_torch_zip

__all__ = [
    "CheckpointCheck",
    "inspect_checkpoint",
    "verify_checkpoint",
    "copy_and_verify",
    "keep_good_copy",
    "pick_resume_checkpoint",
    "mid_epoch_checkpoints",
    "GOOD_NAME",
    "TRAINCTL_KEY",
    "MID_PREFIX",
]

GOOD_NAME = "last_good.pt"
# trainctl's own entry in an Ultralytics checkpoint dict: where inside the epoch a
# mid-epoch save was taken ({"epoch": 0-based epoch in progress, "batch": batches done,
# "samples": samples consumed at the last optimizer step, "kind", ...}).  Ultralytics'
# own "epoch" is then that same epoch in progress (>= 0, so Ultralytics still reads it).
TRAINCTL_KEY = "trainctl"
MID_PREFIX = "mid-"  # checkpoints/mid-<epoch 1-based>-<samples>.pt: the mid-epoch saves


@dataclass(frozen=True)
class CheckpointCheck:
    """What a check found.  ``epoch`` is the checkpoint's 0-based epoch (-1: finished
    run, optimizer stripped); ``epochs`` the run's total; ``seconds`` the check's cost.
    A mid-epoch save (trainctl's own key) has ``batch`` (batches done in epoch ``epoch``,
    which is still in progress), ``samples`` (consumed at its last optimizer step) and
    ``kind`` (periodic, rescue, planned); an end-of-epoch one has ``batch`` None."""

    path: Path
    ok: bool
    detail: str
    epoch: int | None = None
    epochs: int | None = None
    seconds: float = 0.0
    batch: int | None = None
    samples: int | None = None
    kind: str = "epoch"
    refused: bool = False  # the checkpoint gate refused it (``detail`` names the global)

    @property
    def mid_epoch(self) -> bool:
        return self.batch is not None

    @property
    def complete(self) -> bool:
        """The run this checkpoint belongs to has nothing left to train."""
        if self.epoch is not None and self.epoch < 0:
            return True
        if self.mid_epoch:
            return False  # its epoch is still in progress
        return self.epoch is not None and self.epochs is not None and self.epoch + 1 >= self.epochs

    @property
    def position(self) -> tuple[int, int]:
        """Where training resumes from it: (0-based epoch, samples done in that epoch).
        An end-of-epoch checkpoint of epoch e is (e + 1, 0); orders checkpoints by progress."""
        if self.epoch is None:
            return (-1, 0)
        if self.mid_epoch:
            return (self.epoch, self.samples or 0)
        return (self.epoch + 1, 0)


# ------------------------------------------------------------------ pickle walk


class _Obj:
    """A value the walk does not evaluate (its identity is all that matters)."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: dict[Any, Any] | None = None


_MARK = object()
_LITERALS = {
    "BINUNICODE",
    "SHORT_BINUNICODE",
    "UNICODE",
    "BINUNICODE8",
    "BINSTRING",
    "SHORT_BINSTRING",
    "STRING",
    "BININT",
    "BININT1",
    "BININT2",
    "INT",
    "LONG",
    "LONG1",
    "LONG4",
    "BINFLOAT",
    "FLOAT",
}
_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}


def _lit(value: Any) -> Any:
    return value.items if isinstance(value, _Obj) and value.items is not None else value


def scan_pickle(data: bytes) -> dict[Any, Any] | None:
    """The top-level dict of a pickle, without running it.

    Literal values (str, int, float, bool, None) come back as themselves, dicts built
    from literals as dicts; anything else (objects, tensors) as an opaque ``_Obj``.
    None when the top level is not a plain dict.
    """
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    top: _Obj | None = None
    for op, arg, _pos in pickletools.genops(data):
        name = op.name
        if name in _LITERALS:
            stack.append(arg)
        elif name in _CONSTANTS:
            stack.append(_CONSTANTS[name])
        elif name == "EMPTY_DICT":
            obj = _Obj()
            obj.items = {}
            if top is None and not stack:
                top = obj
            stack.append(obj)
        elif name == "MARK":
            stack.append(_MARK)
        elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
            assert arg is not None  # the memo opcodes always carry their index
            memo[int(arg)] = stack[-1]
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1]
        elif name in ("BINGET", "LONG_BINGET", "GET"):
            assert arg is not None
            stack.append(memo[int(arg)])
        elif name in ("SETITEM", "SETITEMS"):
            if name == "SETITEM":
                pairs = [stack.pop(-2), stack.pop()]
            else:
                cut = len(stack) - 1 - stack[::-1].index(_MARK)
                pairs, stack[cut:] = stack[cut + 1 :], []
            target = stack[-1]
            if isinstance(target, _Obj) and target.items is not None:
                for key, value in zip(pairs[::2], pairs[1::2]):
                    if isinstance(key, (str, int)):
                        target.items[key] = _lit(value)
        elif name == "STOP":
            break
        else:
            _generic(op, stack)
    return top.items if top is not None else None


def _generic(op: pickletools.OpcodeInfo, stack: list[Any]) -> None:
    """Apply an opcode's stack effect, with opaque results."""
    before = op.stack_before
    if pickletools.markobject in before:
        cut = len(stack) - 1 - stack[::-1].index(_MARK)
        del stack[cut:]
        fixed = before.index(pickletools.markobject)
    else:
        fixed = len(before)
    if fixed:
        del stack[-fixed:]
    if op.name == "DUP" and stack:
        stack.append(stack[-1])
        return
    stack.extend(_Obj() for _ in op.stack_after)


# ------------------------------------------------------------------ checks


def _fields(top: dict[Any, Any]) -> tuple[Any, Any, Any, Any]:
    """(epoch, optimizer, epochs, trainctl's mid-epoch entry) of a checkpoint dict."""
    args = top.get("train_args")
    epochs = args.get("epochs") if isinstance(args, dict) else None
    return top.get("epoch"), top.get("optimizer"), epochs, top.get(TRAINCTL_KEY)


def _judge(
    path: Path, epoch: Any, optimizer: Any, epochs: Any, mid: Any, how: str, t0: float
) -> CheckpointCheck:
    took = time.perf_counter() - t0
    epochs = epochs if type(epochs) is int else None
    if isinstance(mid, dict) and type(epoch) is int and epoch >= 0 and optimizer is not None:
        batch, samples, kind = mid.get("batch"), mid.get("samples"), mid.get("kind")
        if type(batch) is int and type(samples) is int and mid.get("epoch") == epoch:
            total = f"/{epochs}" if epochs else ""
            return CheckpointCheck(
                path,
                True,
                f"epoch {epoch + 1}{total} batch {batch}, resumable mid-epoch ({how}, {took * 1000:.0f} ms)",
                epoch,
                epochs,
                took,
                batch,
                samples,
                kind if isinstance(kind, str) else "periodic",
            )
    if type(epoch) is not int:
        return CheckpointCheck(
            path, False, f"no 'epoch' in it: not an Ultralytics training checkpoint ({how})", seconds=took
        )
    if epoch < 0:
        return CheckpointCheck(
            path,
            False,
            "a finished run's checkpoint (epoch -1, optimizer stripped): nothing to resume",
            epoch,
            epochs,
            took,
        )
    if optimizer is None:
        return CheckpointCheck(
            path, False, f"epoch {epoch + 1} has no optimizer state: not resumable", epoch, epochs, took
        )
    total = f"/{epochs}" if epochs else ""
    return CheckpointCheck(
        path, True, f"epoch {epoch + 1}{total}, resumable ({how}, {took * 1000:.0f} ms)", epoch, epochs, took
    )


def inspect_checkpoint(
    path: str | os.PathLike[str], *, load: bool = False, trusted: Trusted = ()
) -> CheckpointCheck:
    """Check ``path``: whole, passed by the checkpoint gate (``trusted``: the files the
    user trusts), readable and resumable.  Never raises for a bad file."""
    path = Path(path)
    t0 = time.perf_counter()

    def bad(detail: str) -> CheckpointCheck:
        return CheckpointCheck(path, False, detail, seconds=time.perf_counter() - t0)

    try:
        raw = read_torch_zip(path)
    except Unloadable as exc:
        return bad(str(exc))
    refused = checkpoint_refusal(path, trusted)
    if refused is not None:
        return CheckpointCheck(path, False, refused, seconds=time.perf_counter() - t0, refused=True)
    if load:
        return _load_check(path, t0, trusted)
    try:
        top = scan_pickle(raw)
    except Exception as exc:  # noqa: BLE001 - any malformed pickle is just "bad"
        return bad(f"damaged data.pkl: {type(exc).__name__}: {exc}")
    if top is None:
        return bad("not a checkpoint dict: not an Ultralytics training checkpoint")
    return _judge(path, *_fields(top), "zip + pickle scan", t0)


def _load_check(path: Path, t0: float, trusted: Trusted) -> CheckpointCheck:
    try:
        ckpt = load_checkpoint(path, trusted)
    except GateRefusal as exc:  # the file changed since the gate passed it
        return CheckpointCheck(path, False, str(exc), seconds=time.perf_counter() - t0, refused=True)
    except Exception as exc:  # noqa: BLE001 - whatever torch.load raises means "not loadable"
        return CheckpointCheck(
            path, False, f"torch.load failed: {type(exc).__name__}: {exc}", seconds=time.perf_counter() - t0
        )
    if not isinstance(ckpt, dict):
        return CheckpointCheck(
            path,
            False,
            f"holds a {type(ckpt).__name__}, not a checkpoint dict",
            seconds=time.perf_counter() - t0,
        )
    return _judge(path, *_fields(ckpt), "torch.load", t0)


def verify_checkpoint(
    path: str | os.PathLike[str], *, load: bool = False, trusted: Trusted = ()
) -> tuple[bool, str]:
    """``(ok, detail)``: ok means whole and resumable (``epoch >= 0`` with optimizer state)."""
    check = inspect_checkpoint(path, load=load, trusted=trusted)
    return check.ok, check.detail


def copy_and_verify(
    src: str | os.PathLike[str], dst_dir: str | os.PathLike[str], *, name: str = GOOD_NAME, load: bool = True
) -> CheckpointCheck:
    """Copy ``src`` into ``dst_dir``, check the copy, and only then rename it to ``name``.

    The check runs on the copy, so a later rewrite of ``src`` cannot slip in between.  On
    failure the previous ``name`` is left alone and the result's path is ``src``.
    ``seconds`` is the whole cost: copy, fsync, check and rename.
    """
    t0 = time.perf_counter()
    src, dst_dir = Path(src), Path(dst_dir)
    dst_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # the run's checkpoints: private
    fd, tmp = temp_beside(dst_dir / name)
    try:
        with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
            shutil.copyfileobj(inp, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
        check = inspect_checkpoint(tmp, load=load)
        if not check.ok:
            return CheckpointCheck(
                src, False, check.detail, check.epoch, check.epochs, time.perf_counter() - t0
            )
        final = dst_dir / name
        os.replace(tmp, final)
        fsync_dir(dst_dir)
        return CheckpointCheck(final, True, check.detail, check.epoch, check.epochs, time.perf_counter() - t0)
    except OSError as exc:
        return CheckpointCheck(
            src, False, f"cannot copy: {exc.strerror or exc}", seconds=time.perf_counter() - t0
        )
    finally:
        tmp.unlink(missing_ok=True)


def keep_good_copy(src: str | os.PathLike[str], dst_dir: str | os.PathLike[str]) -> Path | None:
    """Copy ``src`` to ``dst_dir/last_good.pt`` if it checks out; the kept path or None."""
    check = copy_and_verify(src, dst_dir)
    return check.path if check.ok else None


def mid_epoch_checkpoints(checkpoint_dir: str | os.PathLike[str]) -> list[Path]:
    """The mid-epoch saves in a run's ``checkpoints/`` (``mid-*.pt``), newest file first."""
    try:
        found = [p for p in Path(checkpoint_dir).glob(f"{MID_PREFIX}*.pt") if p.is_file()]
    except OSError:
        return []
    stamped = []
    for p in found:
        try:
            stamped.append((p.stat().st_mtime, p.name, p))
        except OSError:
            continue
    return [p for _, _, p in sorted(stamped, reverse=True)]


def pick_resume_checkpoint(
    candidates: Iterable[str | os.PathLike[str] | None],
    *,
    load: bool = False,
    on_skip: Callable[[Path, str], None] | None = None,
    trusted: Trusted = (),
) -> Path | None:
    """The candidate that verifies and goes furthest, or None: by position (epoch, then
    samples done within it; an end-of-epoch checkpoint of epoch e counts as the start of
    e + 1, a mid-epoch save as its epoch and samples), then the newest file.

    Missing files are ignored; each existing one that fails is passed to
    ``on_skip(path, reason)`` (e.g. a truncated ``last.pt``).
    """
    seen: set[Path] = set()
    good: list[tuple[tuple[int, int], float, Path]] = []
    for cand in candidates:
        if cand is None:
            continue
        path = Path(cand)
        key = path.resolve() if path.exists() else path
        if key in seen or not path.exists():
            continue
        seen.add(key)
        check = inspect_checkpoint(path, load=load, trusted=trusted)
        if check.ok:
            good.append((check.position, path.stat().st_mtime, path))
        elif on_skip is not None:
            on_skip(path, check.detail)
    if not good:
        return None
    return max(good, key=lambda item: (item[0], item[1]))[2]
