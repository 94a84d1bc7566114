"""nightshift's own copies of a checkpoint that the program overwrites in place: copied whole and
verified, pruned to the confirmed generations, dropped where a divergence began, and put back
where the program reads it on a resume (what was there moved aside, never deleted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nightshift.runtime.training import checkpoints, keeper

from conftest import need


@pytest.fixture(scope="module")
def torch():
    return need("torch", "checkpoints written with torch.save")


def save(torch, out: Path, iter_num: int) -> checkpoints.Found:
    """nanoGPT's save: one out/ckpt.pt, overwritten."""
    out.mkdir(parents=True, exist_ok=True)
    torch.save(
        {"model": {"w": torch.full((4,), float(iter_num))}, "iter_num": iter_num}, out / "ckpt.pt"
    )
    (found,) = checkpoints.scan(out)
    return found


def test_copies_survive_the_overwrite_and_prune_keeps_confirmed_and_newer(torch, tmp_path):
    ws, out = tmp_path / "job", tmp_path / "job" / "out"
    for step in (25, 50, 75):
        assert keeper.keep(save(torch, out, step), out, ws) is not None
    assert [k["step"] for k in keeper.kept(ws)] == [25, 50, 75]
    # one generation, 50 confirmed (75 not yet): 25 goes, 50 stays, 75 (newer) stays
    assert keeper.prune(ws, 1, confirmed=lambda step: step <= 50) == [25]
    assert [k["step"] for k in keeper.kept(ws)] == [50, 75]
    copy = next(k for k in keeper.kept(ws) if k["step"] == 50)
    assert torch.load(copy["path"], weights_only=True)["iter_num"] == 50  # the overwrite left it
    assert keeper.drop_from(ws, 74) == [75]  # a divergence began at 75
    assert [k["step"] for k in keeper.kept(ws)] == [50]


def test_resume_from_a_copy_puts_it_back_and_moves_the_bad_file_aside(torch, tmp_path):
    ws, out = tmp_path / "job", tmp_path / "job" / "out"
    copy = keeper.keep(save(torch, out, 50), out, ws)
    save(torch, out, 90)  # overwritten again (say with diverged weights)
    assert keeper.restore(str(copy), ws, attempt=2) == str(out / "ckpt.pt")
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == 50
    (aside,) = (ws / keeper.DISPLACED_DIR).rglob("ckpt.pt")
    assert torch.load(aside, weights_only=True)["iter_num"] == 90
    assert keeper.restore(str(out / "ckpt.pt"), ws, attempt=3) == str(out / "ckpt.pt")  # not a copy


def test_a_torn_checkpoint_is_not_copied(torch, tmp_path):
    ws, out = tmp_path / "job", tmp_path / "job" / "out"
    found = save(torch, out, 50)
    (out / "ckpt.pt").write_bytes((out / "ckpt.pt").read_bytes()[:100])
    assert keeper.keep(found, out, ws) is None and keeper.kept(ws) == []
