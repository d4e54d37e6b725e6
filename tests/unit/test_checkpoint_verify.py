"""A command's checkpoints: is it whole (src/trainctl/store/checkpoint_verify.py), and the agent's
CommandRunner and `trainctl run --resume-from` never resume from one that is not."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from trainctl.store.checkpoint_verify import BAD, OK, UNVERIFIED, first_loadable, verify_path  # noqa: E402


def save_state(path: Path, **kw) -> Path:
    """A small model + optimizer state, as a training script saves it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 32)).sum().backward()
    opt.step()
    torch.save(
        {
            "epoch": 3,
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "half": torch.ones(5, dtype=torch.float16),
            "steps": torch.arange(7),
        },
        path,
        **kw,
    )
    return path


def cut(src: Path, dst: Path, fraction: float) -> Path:
    data = src.read_bytes()
    dst.write_bytes(data[: int(len(data) * fraction)])
    return dst


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return save_state(tmp_path_factory.mktemp("ck") / "good.pt")


def test_a_whole_torch_zip_verifies(good):
    v = verify_path(good)
    assert v.status == OK and v.ok and v.usable, v
    assert "CRCs match" in v.detail and "pickle walks" in v.detail
    assert torch.load(good, weights_only=True)["epoch"] == 3  # the file really loads


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.99])
def test_a_torch_zip_cut_short_is_refused(good, tmp_path, fraction):
    v = verify_path(cut(good, tmp_path / "cut.pt", fraction))
    assert v.status == BAD and not v.usable, v
    assert "truncated" in v.detail, v.detail
    with pytest.raises(Exception):  # and it really does not load
        torch.load(v.path, weights_only=True)


def _member_offset(path: Path, suffix: str) -> int:
    """Where a member's data starts in the file (after its local header)."""
    with zipfile.ZipFile(path) as zf:
        info = next(i for i in zf.infolist() if i.filename.endswith(suffix))
    raw = path.read_bytes()
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26 : info.header_offset + 30])
    return info.header_offset + 30 + name_len + extra_len


@pytest.mark.parametrize("member", ["/data/0", "/data.pkl"])
def test_a_flipped_byte_in_a_member_fails_its_crc(good, tmp_path, member):
    bad = tmp_path / "flipped.pt"
    data = bytearray(good.read_bytes())
    at = _member_offset(good, member) + 3
    data[at] ^= 0xFF
    bad.write_bytes(bytes(data))
    v = verify_path(bad)
    assert v.status == BAD and "CRC mismatch" in v.detail and member.lstrip("/") in v.detail, v.detail


def test_a_damaged_pickle_with_a_matching_crc_is_refused(good, tmp_path):
    """The CRC is right but data.pkl ends before STOP: the opcode walk catches it."""
    src = zipfile.ZipFile(good)
    out = tmp_path / "pkl.pt"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(
                info.filename, data[: len(data) // 2] if info.filename.endswith("data.pkl") else data
            )
    v = verify_path(out)
    assert v.status == BAD and "damaged data.pkl" in v.detail, v.detail


def test_a_legacy_torch_file_is_checked_and_refused_when_cut(tmp_path):
    legacy = save_state(tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    assert not zipfile.is_zipfile(legacy)
    v = verify_path(legacy)
    assert v.status == OK and "legacy torch file" in v.detail and "storages" in v.detail, v.detail
    for fraction in (0.01, 0.1, 0.5, 0.99):
        c = verify_path(cut(legacy, tmp_path / f"legacy-{fraction}.pt", fraction))
        assert c.status == BAD, (fraction, c)
        assert "truncated" in c.detail or "damaged legacy torch file" in c.detail, c.detail


def test_unknown_formats_cannot_be_verified_but_are_usable(tmp_path):
    ck = tmp_path / "ck.json"
    ck.write_text('{"epoch": 2}')
    v = verify_path(ck)
    assert v.status == UNVERIFIED and v.usable and not v.ok and "cannot verify" in v.detail, v
    other = tmp_path / "weights"
    other.mkdir()
    (other / "w.npy").write_bytes(b"\x93NUMPY...")
    assert verify_path(other).status == UNVERIFIED
    empty = tmp_path / "empty.pt"
    empty.touch()
    assert verify_path(empty).status == BAD and "empty" in verify_path(empty).detail


# ------------------------------------------------------------------ safetensors, HF, DeepSpeed


def write_safetensors(path: Path, tensors: dict[str, list[float]]) -> Path:
    """The safetensors format by hand: 8-byte little-endian header length, JSON header,
    then the data (float32, little-endian)."""
    header, blob = {"__metadata__": {"format": "pt"}}, b""
    for name, values in tensors.items():
        data = struct.pack(f"<{len(values)}f", *values)
        header[name] = {
            "dtype": "F32",
            "shape": [len(values)],
            "data_offsets": [len(blob), len(blob) + len(data)],
        }
        blob += data
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + blob)
    return path


def test_safetensors_header_and_size(tmp_path):
    st = write_safetensors(tmp_path / "model.safetensors", {"w": [1.0] * 100, "b": [0.5] * 10})
    assert verify_path(st).status == OK
    try:  # the real library reads what was written by hand
        from safetensors.numpy import load_file
    except ImportError:
        pass
    else:
        assert load_file(st)["w"].shape == (100,)
    data = st.read_bytes()
    for n in (4, 20, len(data) - 1):
        st.write_bytes(data[:n])
        v = verify_path(st)
        assert v.status == BAD and "truncated" in v.detail, (n, v.detail)


def make_hf(d: Path, sharded: bool = False) -> Path:
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "tiny"}')
    (d / "trainer_state.json").write_text('{"global_step": 500}')
    if sharded:
        write_safetensors(d / "model-00001-of-00002.safetensors", {"a": [1.0] * 8})
        write_safetensors(d / "model-00002-of-00002.safetensors", {"b": [2.0] * 8})
        (d / "model.safetensors.index.json").write_text(
            json.dumps(
                {
                    "weight_map": {
                        "a": "model-00001-of-00002.safetensors",
                        "b": "model-00002-of-00002.safetensors",
                    }
                }
            )
        )
    else:
        write_safetensors(d / "model.safetensors", {"a": [1.0] * 8})
    save_state(d / "optimizer.pt")
    return d


def test_hf_directories(tmp_path):
    assert verify_path(make_hf(tmp_path / "single")).status == OK
    sharded = make_hf(tmp_path / "sharded", sharded=True)
    v = verify_path(sharded)
    assert v.status == OK and "Hugging Face" in v.detail, v.detail

    (sharded / "model-00002-of-00002.safetensors").unlink()
    v = verify_path(sharded)
    assert v.status == BAD and "model-00002-of-00002.safetensors, which is missing" in v.detail, v.detail

    opt = make_hf(tmp_path / "opt") / "optimizer.pt"
    cut(opt, opt, 0.5)
    v = verify_path(opt.parent)
    assert v.status == BAD and "optimizer.pt" in v.detail and "truncated" in v.detail, v.detail

    cfg = make_hf(tmp_path / "cfg") / "config.json"
    cfg.write_text('{"model_type": "ti')
    assert verify_path(cfg.parent).status == BAD

    no_weights = make_hf(tmp_path / "nowt") / "model.safetensors"
    no_weights.unlink()
    v = verify_path(no_weights.parent)
    assert v.status == BAD and "no model weights" in v.detail, v.detail


def make_deepspeed(d: Path) -> Path:
    tag = d / "global_step500"
    tag.mkdir(parents=True)
    (d / "latest").write_text("global_step500\n")
    save_state(tag / "mp_rank_00_model_states.pt")
    save_state(tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    return d


def test_deepspeed_directories(tmp_path):
    v = verify_path(make_deepspeed(tmp_path / "ds"))
    assert v.status == OK and "DeepSpeed" in v.detail, v.detail

    empty = (
        make_deepspeed(tmp_path / "empty") / "global_step500" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    )
    empty.write_bytes(b"")
    v = verify_path(empty.parent.parent)
    assert v.status == BAD and "optim_states.pt: empty file" in v.detail, v.detail

    gone = make_deepspeed(tmp_path / "gone")
    (gone / "latest").write_text("global_step600")
    v = verify_path(gone)
    assert v.status == BAD and "global_step600" in v.detail, v.detail


def test_first_loadable_takes_the_newest_that_loads(good, tmp_path):
    newest = cut(good, tmp_path / "newest.pt", 0.5)
    skipped: list[tuple[Path, str]] = []
    v = first_loadable(
        [None, tmp_path / "missing.pt", newest, good, newest], on_skip=lambda p, why: skipped.append((p, why))
    )
    assert v is not None and v.path == good
    assert [p for p, _ in skipped] == [newest] and "truncated" in skipped[0][1]
    assert first_loadable(["newest.pt"], base=tmp_path) is None  # relative: from base


# ------------------------------------------------------------------ through the agent and the CLI


def make_agent(run_dir: Path, **spec):
    from trainctl.agent import Agent
    from trainctl.store.paths import make_private_dir
    from trainctl.store.spec import RunSpec

    make_private_dir(run_dir)
    return Agent(
        run_dir,
        RunSpec(job_name="t", kind="command", command=["true"], kernel_log=False, **spec),
        serve=False,
    )


def test_the_command_runner_resumes_from_the_newest_checkpoint_that_loads(good, tmp_path):
    from trainctl.core import events as E
    from trainctl.store.journal import read_events

    agent = make_agent(tmp_path / "run", resume_args=["--resume", "{checkpoint}"], cwd=str(tmp_path))
    ck = tmp_path / "ck"
    ck.mkdir()
    older, newer = ck / "epoch1.pt", ck / "epoch2.pt"
    save_state(older)
    cut(good, newer, 0.99)  # killed while writing epoch 2's checkpoint
    for path in (older, newer):
        agent.ctx.emit(E.Checkpoint(agent.ctx.clock(), str(path.relative_to(tmp_path)), None, True))
    agent.ctx.facts.last_checkpoint = str(newer.relative_to(tmp_path))
    try:
        chosen = agent.loop.resume_checkpoint()
        assert chosen == str(older), chosen
        argv = agent.loop.runner.argv(agent.ctx.spec, agent.ctx.files, None, None, chosen, 2)
        assert argv[-2:] == ["--resume", str(older)]
        # A format it cannot check is resumed from, saying so.
        note = ck / "epoch3.json"
        note.write_text("{}")
        agent.ctx.emit(E.Checkpoint(agent.ctx.clock(), str(note), None, True))
        agent.ctx.facts.last_checkpoint = str(note)
        assert agent.loop.resume_checkpoint() == str(note)
    finally:
        agent.journal.close()
    infos = [e for e in read_events(tmp_path / "run" / "events.jsonl") if e.type == "info"]
    skips = [i.text for i in infos if i.key == "resume_skip"]
    assert skips and all(str(newer) in s and "truncated" in s for s in skips), skips
    assert any(i.key == "resume_unverified" and "cannot verify" in i.text for i in infos), infos


def test_a_fixed_resume_file_that_does_not_load_is_left_out(good, tmp_path):
    """resume_args without {checkpoint} that name a file: a truncated one is not passed; the
    command starts over."""
    last = cut(good, tmp_path / "last.pt", 0.5)
    agent = make_agent(tmp_path / "run", resume_args=["--resume", "last.pt"], cwd=str(tmp_path))
    runner, spec, files = agent.loop.runner, agent.ctx.spec, agent.ctx.files
    try:
        assert agent.loop.resume_checkpoint() is None
        assert runner.argv(spec, files, None, None, None, 2) == ["true"]
        last.write_bytes(good.read_bytes())
        assert agent.loop.resume_checkpoint() == "last.pt"
        assert runner.argv(spec, files, None, None, "last.pt", 2) == ["true", "--resume", "last.pt"]
    finally:
        agent.journal.close()


def test_resume_from_a_truncated_file_is_refused(good, tmp_path):
    truncated = cut(good, tmp_path / "truncated.pt", 0.5)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainctl",
            "run",
            "--json",
            "--resume-arg={checkpoint}",
            "--resume-from",
            str(truncated),
            "--",
            sys.executable,
            "-c",
            "pass",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "--resume-from" in r.stderr and "not a checkpoint that loads" in r.stderr, r.stderr
    assert "truncated" in r.stderr, r.stderr
