"""Does this checkpoint load?  A check for any command's checkpoints, without torch.

The Ultralytics check (checkpoint.py) wants Ultralytics keys; a command's checkpoint only
has to be whole.  What is checked, by format (nothing here imports torch or runs a pickle):

* a torch zip file (``torch.save``'s default): the zip is complete (its central directory is
  there), every member's CRC matches, and ``data.pkl``'s opcodes walk to STOP;
* a legacy torch file (``_use_new_zipfile_serialization=False``): its leading pickles walk,
  and the file is as long as the storages its object pickle names (that format has no CRCs;
  a storage type not known here leaves the data ``unverified``);
* a ``.safetensors`` file: the header's length and JSON parse, and the file holds every
  byte the header declares;
* a Hugging Face directory (``config.json``, ``model.safetensors`` / ``pytorch_model.bin`` /
  a sharded ``*.index.json`` whose shards all exist): its files are complete (JSON parses,
  safetensors headers and sizes, torch zips open and their pickles walk; no CRC pass);
* a DeepSpeed directory (``latest`` naming a tag directory with ``mp_rank_*`` /
  ``*optim_states*`` files): the same for the tag's files;
* anything else: ``unverified`` ("cannot verify"): a restart still resumes from it, saying so.
"""

from __future__ import annotations

import json
import os
import pickletools
import struct
import time
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Verdict",
    "Unloadable",
    "verify_path",
    "first_loadable",
    "read_torch_zip",
    "checkpoint_dir_kinds",
    "OK",
    "BAD",
    "UNVERIFIED",
]

OK, BAD, UNVERIFIED = "ok", "bad", "unverified"
_ZIP_MAGIC = b"PK\x03\x04"
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER
_SAFETENSORS_MAX_HEADER = 100_000_000  # the safetensors format's own limit
_TORCH_SUFFIXES = {".pt", ".pth", ".bin", ".ckpt", ".tar"}


@dataclass(frozen=True)
class Verdict:
    """``status``: ``ok`` (whole), ``bad`` (never resume from it) or ``unverified`` (no check
    for this format, or only part of it); ``detail`` says which and why."""

    path: Path
    status: str
    detail: str
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def usable(self) -> bool:
        """A restart may resume from it (whole, or of a format that cannot be checked)."""
        return self.status != BAD


class Unloadable(Exception):
    """The file would not load; ``str()`` says why."""


# ------------------------------------------------------------------ single files


def read_torch_zip(path: Path, *, crc: bool = True) -> bytes:
    """``data.pkl`` of a whole torch zip archive (every member's CRC checked when ``crc``)."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise Unloadable(f"cannot read: {exc.strerror or exc}") from None
    if size == 0:
        raise Unloadable("empty file (0 bytes)")
    if not zipfile.is_zipfile(path):
        raise Unloadable(f"not a complete zip archive ({size:,} bytes): truncated or corrupted")
    try:
        with zipfile.ZipFile(path) as zf:
            if crc:
                broken = zf.testzip()
                if broken is not None:
                    raise Unloadable(f"CRC mismatch in {broken}: corrupted")
            for name in zf.namelist():
                if name.endswith("/data.pkl") and name.count("/") == 1:
                    return zf.read(name)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise Unloadable(f"unreadable zip archive: {exc}") from None
    raise Unloadable("no data.pkl inside: not a torch checkpoint")


def _walk(data, what: str, first: Callable[[list], None] | None = None) -> None:
    """Walk one pickle's opcodes to STOP (``data``: bytes, or a file at the pickle's start).
    ``first`` judges the arguments of its first three opcodes (raising _NotThisFormat); a
    pickle that breaks before ``first`` has judged it is not of that format."""
    head: list | None = [] if first is not None else None
    try:
        for _op, arg, _pos in pickletools.genops(data):
            if head is not None and first is not None:  # head is a list only when first is given
                head.append(arg)
                if len(head) == 3:
                    first(head)
                    head = None
    except _NotThisFormat:
        raise
    except Exception as exc:  # noqa: BLE001 - any malformed pickle is just "bad"
        if head is not None:
            raise _NotThisFormat from None
        raise Unloadable(f"damaged {what}: {exc}") from None
    if head is not None and first is not None:
        first(head)


def _torch_zip(path: Path, crc: bool) -> str:
    _walk(read_torch_zip(path, crc=crc), "data.pkl")
    return "torch zip: complete, " + ("CRCs match, " if crc else "") + "pickle walks"


def _is_legacy(head: list) -> None:
    if _LEGACY_MAGIC not in head:
        raise _NotThisFormat


# bytes per element of the storage classes torch's legacy format names
_ELEMENT_SIZE = {
    "Double": 8,
    "Float": 4,
    "Half": 2,
    "BFloat16": 2,
    "Long": 8,
    "Int": 4,
    "Short": 2,
    "Char": 1,
    "Byte": 1,
    "Bool": 1,
    "ComplexDouble": 16,
    "ComplexFloat": 8,
    "QUInt8": 1,
    "QInt8": 1,
    "QInt32": 4,
    "QUInt4x2": 1,
    "QUInt2x4": 1,
    "Untyped": 1,
}


def _storage_kind(name: str) -> str:
    """``"torch FloatStorage"`` -> ``"Float"`` (no str.removeprefix: Python 3.8 runs this)."""
    if name.startswith("torch "):
        name = name[len("torch ") :]
    return name[: -len("Storage")] if name.endswith("Storage") else name


def _legacy_storages(f) -> dict[str, int] | None:
    """Walk the object pickle of a legacy torch file: its storages' byte counts by key, or
    None when one of them is of a type not known here."""
    storages: dict[str, int] = {}
    known = True
    memo: dict[int, object] = {}
    items: list[object] = []
    last: object = None
    try:
        for op, arg, _pos in pickletools.genops(f):
            name = op.name
            value: object = None
            if name == "MARK":
                items = []
            elif name == "GLOBAL":
                value = ("global", arg)
            elif name == "STACK_GLOBAL":  # protocol 4: module and name pushed before it
                value = ("global", " ".join(map(str, items[-2:])))
                del items[-2:]
            elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
                assert arg is not None  # the memo opcodes always carry their index
                memo[int(arg)] = last
            elif name == "MEMOIZE":
                memo[len(memo)] = last
            elif name in ("BINGET", "LONG_BINGET", "GET"):
                assert arg is not None
                value = memo.get(int(arg))
            elif name == "TUPLE" and len(items) >= 5 and items[0] == "storage":
                cls, key, numel = items[1], items[2], items[4]
                kind = _storage_kind(cls[1]) if isinstance(cls, tuple) and isinstance(cls[1], str) else None
                if kind in _ELEMENT_SIZE and type(numel) is int and isinstance(key, str):
                    storages[key] = numel * _ELEMENT_SIZE[kind]
                else:
                    known = False
            elif op.arg is not None:
                value = arg
            if name not in ("BINPUT", "LONG_BINPUT", "PUT", "MEMOIZE"):
                last = value
                if value is not None:
                    items.append(value)
    except Exception as exc:  # noqa: BLE001 - any malformed pickle is just "bad"
        raise Unloadable(f"damaged legacy torch file (object pickle): {exc}") from None
    return storages if known else None


def _torch_legacy(path: Path) -> Verdict:
    """The pickles torch's legacy format starts with (magic number, protocol, system info,
    the object, its storage keys) walk, and the file holds every storage's bytes after
    them (each: an 8-byte count, then the data).  There are no CRCs in this format."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        _walk(f, "legacy torch file's first pickle", _is_legacy)
        for what in ("protocol version", "system info"):
            _walk(f, f"legacy torch file ({what} pickle)")
        storages = _legacy_storages(f)
        _walk(f, "legacy torch file (storage keys pickle)")
        need = f.tell() + sum(8 + n for n in (storages or {}).values())
    if storages is None:
        return Verdict(
            path,
            UNVERIFIED,
            "legacy torch file (not zip): its pickles walk; a storage "
            "of a type not known here: the tensor data cannot be verified",
        )
    if size < need:
        raise Unloadable(
            f"legacy torch file of {size:,} bytes, its {len(storages)} storages end at {need:,}: truncated"
        )
    return Verdict(
        path,
        OK,
        f"legacy torch file (not zip): pickles walk, the data of its "
        f"{len(storages)} storages is all there (this format has no CRCs)",
    )


class _NotThisFormat(Exception):
    pass


def _safetensors(path: Path) -> str:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise Unloadable(f"safetensors file of {size} bytes: truncated (no header length)")
        (n,) = struct.unpack("<Q", head)
        if n > _SAFETENSORS_MAX_HEADER:
            raise Unloadable(f"safetensors header length {n:,} is not plausible: corrupted")
        raw = f.read(n)
    if len(raw) < n:
        raise Unloadable(f"safetensors header cut short ({len(raw):,} of {n:,} bytes): truncated")
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise Unloadable(f"safetensors header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise Unloadable("safetensors header is not a JSON object")
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(type(o) is int and o >= 0 for o in offsets)
            or offsets[0] > offsets[1]
        ):
            raise Unloadable(f"safetensors header: bad data_offsets for {name!r}")
        end = max(end, offsets[1])
    need = 8 + n + end
    if size < need:
        raise Unloadable(f"safetensors file is {size:,} bytes, its header declares {need:,}: truncated")
    return f"safetensors: header and {len(header) - ('__metadata__' in header)} tensors' data complete"


def _sniff_safetensors(path: Path, head: bytes) -> bool:
    if path.suffix == ".safetensors":
        return True
    return len(head) >= 9 and head[8:9] == b"{" and struct.unpack("<Q", head[:8])[0] < _SAFETENSORS_MAX_HEADER


def _file(path: Path, *, crc: bool = True) -> Verdict:
    """Check one file: OK or UNVERIFIED with a detail; raises Unloadable."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as exc:
        raise Unloadable(f"cannot read: {exc.strerror or exc}") from None
    if not head:
        raise Unloadable("empty file (0 bytes)")
    if head.startswith(_ZIP_MAGIC):
        return Verdict(path, OK, _torch_zip(path, crc))
    if head[:1] == b"\x80":  # a pickle (protocol 2+): torch's legacy format starts so
        try:
            return _torch_legacy(path)
        except _NotThisFormat:
            pass
    if _sniff_safetensors(path, head):
        return Verdict(path, OK, _safetensors(path))
    return Verdict(
        path,
        UNVERIFIED,
        "cannot verify: not a format trainctl knows (torch zip, legacy "
        "torch, safetensors, HF or DeepSpeed directory)",
    )


# ------------------------------------------------------------------ directories


def _json(path: Path) -> None:
    try:
        json.loads(path.read_bytes())
    except OSError as exc:
        raise Unloadable(f"{path.name}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise Unloadable(f"{path.name}: not complete JSON ({exc})") from None


def _member(path: Path, base: Path) -> Verdict:
    """A directory's file: complete (no CRC pass: a sequential write that reached its end
    is whole), else Unloadable naming it."""
    try:
        return _file(path, crc=False)
    except Unloadable as exc:
        raise Unloadable(f"{path.relative_to(base)}: {exc}") from None


def _deepspeed(d: Path) -> list[Verdict]:
    try:
        tag = (d / "latest").read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise Unloadable(f"latest: cannot read: {exc}") from None
    if not tag or "/" in tag or tag in (".", ".."):
        raise Unloadable(f"latest names no tag ({tag!r})")
    tag_dir = d / tag
    if not tag_dir.is_dir():
        raise Unloadable(f"latest names {tag}, which is not a directory here")
    files = sorted(
        p
        for p in tag_dir.iterdir()
        if p.is_file() and (p.name.startswith("mp_rank_") or "optim_states" in p.name)
    )
    if not files:
        raise Unloadable(f"{tag}/ holds no mp_rank_* or *optim_states* files")
    return [_member(p, d) for p in files]


def _hf(d: Path, deepspeed: bool) -> list[Verdict]:
    names = {p.name for p in d.iterdir()}
    indexes = sorted(d.glob("*.index.json"))
    weights = {
        "model.safetensors",
        "pytorch_model.bin",
        "adapter_model.safetensors",
        "adapter_model.bin",
    } & names
    if not weights and not indexes and not deepspeed:
        raise Unloadable("no model weights (model.safetensors, pytorch_model.bin or a sharded *.index.json)")
    for p in sorted(d.glob("*.json")):
        _json(d / p.name)
    done: set[str] = set()
    out: list[Verdict] = []
    for index in indexes:
        weight_map = json.loads(index.read_bytes()).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise Unloadable(f"{index.name}: no weight_map")
        for shard in sorted(set(map(str, weight_map.values()))):
            p = d / shard
            if not p.is_file():
                raise Unloadable(f"{index.name} lists {shard}, which is missing")
            out.append(_member(p, d))
            done.add(shard)
    for p in sorted(d.iterdir()):
        if p.name not in done and p.is_file() and (p.suffix == ".safetensors" or p.suffix in _TORCH_SUFFIXES):
            out.append(_member(p, d))
    return out


def checkpoint_dir_kinds(d: Path) -> tuple[bool, bool]:
    """(DeepSpeed, Hugging Face): what kinds of checkpoint directory ``d`` looks like."""
    names = {p.name for p in d.iterdir()}
    hf = bool(names & {"config.json", "adapter_config.json", "trainer_state.json"}) or any(
        n.endswith((".safetensors", ".index.json")) or n.startswith("pytorch_model") for n in names
    )
    return "latest" in names, hf


def _directory(d: Path) -> Verdict:
    deepspeed, hf = checkpoint_dir_kinds(d)
    if not deepspeed and not hf:
        return Verdict(
            d,
            UNVERIFIED,
            "cannot verify: a directory that is neither a Hugging Face nor a DeepSpeed checkpoint",
        )
    checked = (_deepspeed(d) if deepspeed else []) + (_hf(d, deepspeed) if hf else [])
    what = " + ".join(w for w, on in (("DeepSpeed", deepspeed), ("Hugging Face", hf)) if on)
    partial = [v for v in checked if not v.ok]
    detail = f"{what} checkpoint directory: {len(checked)} files complete"
    if partial:
        return Verdict(d, UNVERIFIED, f"{detail}, but {partial[0].path.name}: {partial[0].detail}")
    return Verdict(d, OK, detail)


# ------------------------------------------------------------------ entry points


def verify_path(path: str | os.PathLike[str]) -> Verdict:
    """Check a checkpoint file or directory.  Never raises for a bad one."""
    path = Path(path)
    t0 = time.perf_counter()
    try:
        verdict = _directory(path) if path.is_dir() else _file(path)
    except Unloadable as exc:
        verdict = Verdict(path, BAD, str(exc))
    except OSError as exc:
        verdict = Verdict(path, BAD, f"cannot read: {exc.strerror or exc}")
    took = time.perf_counter() - t0
    return Verdict(path, verdict.status, f"{verdict.detail} ({took * 1000:.0f} ms)", took)


def first_loadable(
    candidates: Iterable[str | os.PathLike[str] | None],
    *,
    on_skip: Callable[[Path, str], None] | None = None,
    base: str | os.PathLike[str] | None = None,
    verify: Callable[[Path], Verdict] = verify_path,
) -> Verdict | None:
    """The first candidate (give them newest first) that is not refused: whole, or of a
    format that cannot be checked (its verdict says so).  Missing paths and repeats are
    passed over quietly; each one refused goes to ``on_skip(path, reason)``.  Relative
    paths are taken from ``base`` (the trainer's working directory); ``verify`` checks one."""
    seen: set[Path] = set()
    for cand in candidates:
        if cand is None or cand == "":
            continue
        path = Path(cand).expanduser()
        if base is not None and not path.is_absolute():
            path = Path(base) / path
        if path in seen or not path.exists():
            continue
        seen.add(path)
        verdict = verify(path)
        if verdict.usable:
            return verdict
        if on_skip is not None:
            on_skip(path, verdict.detail)
    return None
