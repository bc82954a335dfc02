"""Which checkpoint is complete (supervisor/model/checkpoints.py), format by format, on real
files: a zip written by zipfile (and by torch.save where torch is installed), safetensors
bytes, DCP and HF directories, the completion marker, temporary names, plain files."""

from __future__ import annotations

import json
import os
import struct
import time
import zipfile
from pathlib import Path

import pytest

from trainctl.supervisor.model import checkpoints
from trainctl.supervisor.model.checkpoints import judge, newest, step_of_name


def _old(path: Path, age_s: float = 10.0) -> None:
    """Make ``path`` (and a directory's files) look written ``age_s`` ago."""
    t = time.time() - age_s
    for p in [path, *(path.rglob("*") if path.is_dir() else [])]:
        os.utime(p, (t, t))


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("step_000120.pt", 120),
        ("checkpoint-120", 120),
        ("iter_0000120", 120),
        ("epoch=3-step=1200.ckpt", 1200),
        ("global_step120", 120),
        ("run/step_40/__0_0.distcp", 40),
        ("ckpt.pt", None),
        ("model_v2.safetensors", None),
    ],
)
def test_the_step_comes_from_the_name(name: str, step: int | None) -> None:
    assert step_of_name(name) == step


def test_a_zip_is_complete_only_with_its_end_record(tmp_path: Path) -> None:
    path = tmp_path / "step_10.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"x" * 100_000)
    _old(path)
    v = judge(str(path))
    assert v is not None
    assert (v.complete, v.why, v.step) == (True, "zip end record", 10.0)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 30])  # the writer's last bytes not there yet
    _old(path)
    v = judge(str(path))
    assert v is not None
    assert (v.complete, v.why) == (False, "zip without its end record")


def test_a_real_torch_save_is_judged_by_its_zip(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    path = tmp_path / "ckpt.pt"
    torch.save({"w": torch.zeros(1000), "iter_num": 7}, path)
    assert judge(str(path)).complete  # type: ignore[union-attr]
    path.write_bytes(path.read_bytes()[:-100])
    assert not judge(str(path)).complete  # type: ignore[union-attr]


def _safetensors(path: Path, nbytes: int, cut: int = 0) -> None:
    header = json.dumps(
        {"w": {"dtype": "F32", "shape": [nbytes // 4], "data_offsets": [0, nbytes]}}
    ).encode()
    data = struct.pack("<Q", len(header)) + header + b"\0" * nbytes
    path.write_bytes(data[: len(data) - cut])


def test_safetensors_must_be_as_long_as_its_header_says(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    _safetensors(path, 4096)
    assert judge(str(path)).complete  # type: ignore[union-attr]
    _safetensors(path, 4096, cut=1)
    v = judge(str(path))
    assert v is not None
    assert not v.complete
    path.write_bytes(b"\xff" * 8)  # a header size past the end: never trusted
    assert not judge(str(path)).complete  # type: ignore[union-attr]


def test_dcp_is_complete_with_metadata_written_after_its_shards(tmp_path: Path) -> None:
    d = tmp_path / "step_30"
    d.mkdir()
    (d / "__0_0.distcp").write_bytes(b"a" * 100)
    _old(d)
    v = judge(str(d))
    assert v is not None
    assert (v.complete, v.why) == (False, "DCP shards without .metadata")
    (d / ".metadata").write_bytes(b"m")
    v = judge(str(d))
    assert v is not None
    assert (v.complete, v.step) == (True, 30.0)
    # a save in place: new shards after the old .metadata
    t = time.time() - 20
    os.utime(d / ".metadata", (t, t))
    (d / "__0_0.distcp").write_bytes(b"b" * 100)
    v = judge(str(d))
    assert v is not None
    assert (v.complete, v.why) == (False, "DCP shards newer than .metadata")


def test_hf_checkpoint_needs_trainer_state(tmp_path: Path) -> None:
    d = tmp_path / "checkpoint-500"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"")
    assert not judge(str(d)).complete  # type: ignore[union-attr]
    (d / "trainer_state.json").write_text("{}")
    v = judge(str(d))
    assert v is not None
    assert (v.complete, v.step) == (True, 500.0)


def test_temporary_names_and_nemo_unfinished_are_partial(tmp_path: Path) -> None:
    for name in ["ckpt.pt.tmp", ".ckpt.pt", "tmpab12", "step=10-unfinished", "x.part"]:
        (tmp_path / name).write_bytes(b"z")
        _old(tmp_path / name)
        v = judge(str(tmp_path / name))
        assert v is not None
        assert not v.complete, name


def test_the_marker_vouches_only_for_what_was_written_before_it(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"w" * 10)
    assert judge(str(path), look_again=False).complete is False  # just written, no marker
    checkpoints.mark_complete(str(path))
    v = judge(str(path), look_again=False)
    assert v is not None
    assert (v.complete, v.why) == (True, "completion marker")
    later = time.time() + 5  # rewritten in place after its marker
    os.utime(path, (later, later))
    assert judge(str(path), look_again=False).complete is False  # type: ignore[union-attr]


def test_a_plain_file_is_complete_once_its_size_held(tmp_path: Path) -> None:
    path = tmp_path / "state.bin"
    path.write_bytes(b"s" * 10)
    v = judge(str(path))  # written just now: looked at twice, unchanged
    assert v is not None
    assert (v.complete, v.why) == (True, "size held")
    _old(path)
    assert judge(str(path), look_again=False).complete  # type: ignore[union-attr]


def test_newest_skips_a_partial_one_and_names_it(tmp_path: Path) -> None:
    good = tmp_path / "step_100.pt"
    with zipfile.ZipFile(good, "w") as z:
        z.writestr("a", b"1")
    _old(good, 30)
    bad = tmp_path / "step_110.pt"
    bad.write_bytes(good.read_bytes()[:-10])
    _old(bad, 5)
    found = newest(str(tmp_path), "step_*.pt")
    assert found.complete is not None
    assert found.partial is not None
    assert (found.complete.path, found.complete.step) == (str(good), 100.0)
    assert found.partial.path == str(bad)
    # a name without a step: the progress step when it was written
    plain = tmp_path / "ckpt.pt"
    plain.write_bytes(good.read_bytes())
    _old(plain, 3)
    found = newest(str(tmp_path), "ckpt.pt", lambda t: 4242.0)
    assert found.complete is not None
    assert found.complete.step == 4242.0


def test_an_unreadable_or_looping_tree_is_named_not_followed(tmp_path: Path) -> None:
    d = tmp_path / "ck"
    d.mkdir()
    (d / "loop").symlink_to(tmp_path)  # out of the tree, and back into it
    (d / "out").symlink_to("/")
    _old(d)
    v = judge(str(d))
    assert v is not None  # judged without walking out of the tree
    gone = tmp_path / "dangling.pt"
    gone.symlink_to(tmp_path / "nothing")
    assert judge(str(gone)) is None


def test_the_trainers_own_record_of_the_step_is_exact_and_an_estimate_says_so(
    tmp_path: Path,
) -> None:
    """Issue 54 §6: the step from the trainer's own record where it is cheap (a marker
    that says it, HF's trainer_state.json of a folder named otherwise), else the
    progress lookup's, marked estimated (shown with ≈)."""
    marked = tmp_path / "latest.pt"
    marked.write_bytes(b"weights")
    time.sleep(0.01)
    (tmp_path / "latest.pt.complete").write_text(json.dumps({"step": 1050}))
    v = judge(str(marked))
    assert v is not None
    assert (v.complete, v.step, v.step_estimated) == (True, 1050.0, False)
    best = tmp_path / "best"
    best.mkdir()
    (best / "model.safetensors").write_bytes(b"")
    (best / "trainer_state.json").write_text(json.dumps({"global_step": 172}))
    hf = judge(str(best))
    assert hf is not None
    assert hf.step == 172.0
    plain = tmp_path / "ckpt.pt"
    with zipfile.ZipFile(plain, "w") as z:
        z.writestr("archive/data.pkl", "x")
    [got] = checkpoints.complete_ones(str(tmp_path), "ckpt.pt", lambda _t: 99.0, want=1)
    assert (got.step, got.step_estimated) == (99.0, True)
