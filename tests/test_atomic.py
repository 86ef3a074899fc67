"""core/atomic on its own, with the fault at the call that fails: an error a writer raises without
an errno, and a stale temp another process removes first (two ranks cleaning one folder)."""

from __future__ import annotations

import pytest

from turbotrain.core import atomic
from turbotrain.core.atomic import WriteError, atomic_write, remove_stale_temps


def _fails(f):
    f.write(b"partial")
    raise OSError("the device went away")  # no errno: os.strerror(None) would raise instead


def test_a_write_error_without_errno_is_named_by_its_own_text_and_keeps_the_previous_file(tmp_path):
    path = tmp_path / "model.bin"
    with pytest.raises(WriteError) as e:
        atomic_write(path, _fails)
    assert str(e.value) == f"could not write {path}: the device went away (no model.bin was written)"
    path.write_bytes(b"previous")
    with pytest.raises(WriteError) as e:
        atomic_write(path, _fails)
    assert str(e.value) == f"could not write {path}: the device went away (the previous model.bin was kept)"
    assert path.read_bytes() == b"previous" and [p.name for p in tmp_path.iterdir()] == ["model.bin"]


def test_a_stale_temp_removed_by_another_process_first_is_no_error(tmp_path, monkeypatch):
    stale = tmp_path / ".last.pt.tmp424242"
    stale.write_bytes(b"partial")

    def other_rank_removes_it_first(pid: int) -> bool:
        stale.unlink()
        return False  # its writer is dead

    monkeypatch.setattr(atomic, "_alive", other_rank_removes_it_first)
    assert remove_stale_temps(tmp_path) == [stale.name]
    assert list(tmp_path.iterdir()) == []
