"""core/checkpoint.py on its own, against values written out by hand: which tensors a
checkpoint may not hold, how an unreadable file is named, best.pt and last.pt as one file, and an
optimizer that keeps its own kernel when its state is loaded (milliseconds each; the whole-run
round trips are in test_resume.py and test_reliability.py)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from conftest import checkpoint
from turbotrain.core import checkpoint as ckpt_io
from turbotrain.core.checkpoint import CheckpointError
from turbotrain.models.saved import load_weights


def test_nonfinite_names_each_nan_or_inf_tensor_of_the_model_average_and_optimizer():
    ckpt = {
        "model": {"conv.weight": torch.tensor([1.0, math.nan]), "fc.bias": torch.ones(2), "bn.num_batches": torch.tensor(3)},
        "ema": {"weights": {"conv.weight": torch.tensor([math.inf]), "fc.bias": torch.zeros(1)}},
        "optimizer": {"state": {0: {"step": torch.tensor(2.0), "exp_avg": torch.tensor([-math.inf])}, 1: {"note": 5}}},
    }
    assert ckpt_io.nonfinite(ckpt) == ["model.conv.weight", "ema.weights.conv.weight", "optimizer.state.0.exp_avg"]
    clean = {"model": {"w": torch.ones(2)}, "ema": None, "optimizer": {"state": {0: {"momentum_buffer": torch.zeros(2)}}}}
    assert ckpt_io.nonfinite(clean) == []


def _saved(tmp_path, obj, name="x.pt"):
    path = tmp_path / name
    torch.save(obj, path)
    return path


def test_load_names_the_file_and_what_is_wrong_with_it(tmp_path):
    not_ours = "is not a turbotrain checkpoint (format 1)"
    cases = {
        tmp_path / "missing.pt": f"checkpoint not found: {tmp_path / 'missing.pt'}",
        _saved(tmp_path, {"format": 2, "model": {}}, "later.pt"): f"checkpoint {tmp_path / 'later.pt'} {not_ours}",
        _saved(tmp_path, {"format": 1}, "nomodel.pt"): f"checkpoint {tmp_path / 'nomodel.pt'} {not_ours}",
        _saved(tmp_path, [1, 2], "list.pt"): f"checkpoint {tmp_path / 'list.pt'} {not_ours}",
    }
    for path, message in cases.items():
        with pytest.raises(CheckpointError) as refused:
            ckpt_io.load(path)
        assert str(refused.value) == message
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a zip file at all")
    with pytest.raises(CheckpointError) as refused:
        ckpt_io.load(garbage)
    # torch's own words, from its page of advice only the line that names the fault
    assert str(refused.value) == f"checkpoint {garbage} is unreadable or corrupt (UnpicklingError: Unsupported operand 110)"
    assert ckpt_io.load(_saved(tmp_path, {"format": 1, "model": {"w": torch.ones(1)}}))["model"]["w"].item() == 1.0


class Gadget:  # a class outside torch's safe globals: what a crafted checkpoint's pickle would run
    pass


def test_a_pickled_object_is_refused_even_where_the_environment_lifts_torchs_safe_load(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # torch's default then loads any pickle
    path = _saved(tmp_path, {"format": 1, "model": {}, "x": Gadget()})
    with pytest.raises(CheckpointError) as refused:
        ckpt_io.load(path)
    gadget = f"{__name__}.Gadget"
    assert str(refused.value).startswith(
        f"checkpoint {path} is unreadable or corrupt (UnpicklingError: Unsupported global: GLOBAL {gadget} was not an"
        f" allowed global by default. Please use `torch.serialization.add_safe_globals([{gadget}])`"
    )
    assert "\n" not in str(refused.value) and "Weights only load failed" not in str(refused.value)


def test_a_state_of_another_architecture_is_named_in_one_line():
    model, other = (nn.Sequential(nn.Linear(n, 2), nn.Linear(2, n)) for n in (3, 4))  # four mismatches
    with pytest.raises(RuntimeError) as by_torch:
        model.load_state_dict(other.state_dict())
    with pytest.raises(CheckpointError) as refused:
        ckpt_io.load_model_state(model, other.state_dict(), "run/best.pt")
    torch_lines = str(by_torch.value).strip().splitlines()
    assert len(torch_lines) > 3  # the message keeps torch's heading and first two mismatches
    assert str(refused.value) == (
        "checkpoint run/best.pt does not fit the configured model (different model or num_classes?): "
        + " ".join(line.strip() for line in torch_lines[:3])
    )


def test_best_and_last_are_one_file_and_a_plain_save_writes_last_alone(tmp_path):
    ckpt_io.write({"format": 1, "model": {"w": torch.ones(1)}}, tmp_path, best=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]
    ckpt_io.write({"format": 1, "model": {"w": torch.full((1,), 2.0)}}, tmp_path, best=True)
    assert (tmp_path / "best.pt").samefile(tmp_path / "last.pt")
    assert ckpt_io.load(tmp_path / "last.pt")["model"]["w"].item() == 2.0
    ckpt_io.write({"format": 1, "model": {"w": torch.full((1,), 3.0)}}, tmp_path, best=False)  # best.pt stays
    assert [ckpt_io.load(tmp_path / n)["model"]["w"].item() for n in ("best.pt", "last.pt")] == [2.0, 3.0]


def test_restore_loads_the_state_and_keeps_the_optimizers_own_kernel():
    params = [nn.Parameter(torch.ones(3))]
    saved_opt = torch.optim.SGD(params, lr=0.5, momentum=0.9, foreach=True)
    params[0].grad = torch.full((3,), 2.0)
    saved_opt.step()
    fused = torch.optim.SGD([nn.Parameter(torch.ones(3))], lr=0.1, momentum=0.9, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    saved = {"optimizer": saved_opt.state_dict(), "scaler": torch.amp.GradScaler("cpu", init_scale=64.0).state_dict()}
    ckpt_io.restore(saved, optimizer=fused, scaler=scaler)
    group = fused.param_groups[0]
    assert (group["fused"], group["foreach"], group["lr"], scaler.get_scale()) == (True, None, 0.5, 64.0)
    assert torch.equal(next(iter(fused.state.values()))["momentum_buffer"], torch.full((3,), 2.0))
    ckpt_io.restore({**saved, "scaler": None}, optimizer=fused, scaler=scaler)  # a run saved without one: kept
    ckpt_io.restore(saved, optimizer=fused, scaler=None)  # a scaler saved, none here: nothing to load into
    assert scaler.get_scale() == 64.0


def test_a_checkpoint_carries_the_loss_scalers_state_to_the_resumed_run():
    ckpt = checkpoint(scaler=torch.amp.GradScaler("cpu", init_scale=64.0))
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    ckpt_io.restore(ckpt, optimizer=torch.optim.SGD([nn.Parameter(torch.ones(3))], lr=0.1), scaler=scaler)
    assert scaler.get_scale() == 64.0


def test_the_weight_average_a_checkpoint_carries_is_what_its_model_is_loaded_with():
    trained, averaged = nn.Linear(2, 2), nn.Linear(2, 2)
    ckpt = checkpoint(state_dict=trained.state_dict(), arch={}, ema={"weights": averaged.state_dict(), "updates": 3})
    loaded = nn.Linear(2, 2)
    load_weights(loaded, ckpt, "run/best.pt", averaged=True)
    assert torch.equal(loaded.weight, averaged.weight) and not torch.equal(loaded.weight, trained.weight)


def test_load_puts_the_tensors_on_the_device_it_is_told(tmp_path):
    # as a GPU's checkpoint read on a CPU: not where they were saved (meta stands in for the other device)
    ckpt_io.write({"format": 1, "model": {"w": torch.ones(2)}}, tmp_path, best=False)
    devices = [ckpt_io.load(tmp_path / "last.pt", **kw)["model"]["w"].device.type for kw in ({}, {"map_location": "meta"})]
    assert devices == ["cpu", "meta"]


def test_without_hard_links_last_is_a_second_write_of_the_same_state(tmp_path, monkeypatch):
    def no_links(src, dst):  # as on a filesystem that has none (some network and FUSE mounts)
        raise OSError(1, "Operation not permitted", str(dst))

    monkeypatch.setattr(ckpt_io, "atomic_write_link", no_links)
    ckpt_io.write({"format": 1, "model": {"w": torch.full((1,), 2.0)}}, tmp_path, best=True)
    assert not (tmp_path / "best.pt").samefile(tmp_path / "last.pt")
    assert [ckpt_io.load(tmp_path / n)["model"]["w"].item() for n in ("best.pt", "last.pt")] == [2.0, 2.0]
