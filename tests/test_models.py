"""Model construction: torchvision by name, greyscale adaptation, heads, augmentation, checkpoints."""

from __future__ import annotations

import pytest
import torch

from conftest import make_cfg
from turbotrain.config import ConfigError
from turbotrain.core.checkpoint import CheckpointError, atomic_save, load, load_model_state
from turbotrain.data.augment import build_op
from turbotrain.models import build_model
from turbotrain.models.vision import adapt_input_channels


def test_greyscale_adaptation_matches_grey_rgb_input():
    torch.manual_seed(0)
    rgb = build_model(make_cfg("model=resnet18").model, 10, 3).eval()
    grey = build_model(make_cfg("model=resnet18").model, 10, 3).eval()
    grey.load_state_dict(rgb.state_dict())
    adapt_input_channels(grey, 1)
    x = torch.randn(2, 1, 32, 32)
    torch.testing.assert_close(grey(x), rgb(x.expand(-1, 3, -1, -1)), rtol=1e-4, atol=1e-4)


def test_unknown_model_and_missing_weights_are_clear():
    with pytest.raises(ConfigError, match="model.name='resnet19'"):
        build_model(make_cfg("model.name=resnet19").model, 10, 3)
    with pytest.raises(ConfigError, match="small_cnn has no pretrained"):
        build_model(make_cfg("model.pretrained=true").model, 10, 1)


def test_augment_ops_and_random_choice():
    op = build_op(
        {
            "name": "random_choice",
            "ops": [{"name": "RandomRotation", "degrees": 10}, {"name": "RandomHorizontalFlip", "p": 1.0}],
        }
    )
    assert op(torch.zeros(1, 8, 8, dtype=torch.uint8)).shape == (1, 8, 8)
    with pytest.raises(ConfigError, match="RandomFlop"):
        build_op({"name": "RandomFlop"})


def test_atomic_save_and_clear_load_errors(tmp_path):
    path = tmp_path / "c.pt"
    atomic_save({"format": 1, "model": {"w": torch.ones(2)}}, path)
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]
    assert torch.equal(load(path)["model"]["w"], torch.ones(2))
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(CheckpointError, match="corrupt"):
        load(path)
    with pytest.raises(CheckpointError, match="not found"):
        load(tmp_path / "missing.pt")


def test_checkpoint_for_another_model_is_a_clear_error():
    model = build_model(make_cfg().model, 10, 1)
    other = build_model(make_cfg().model, 5, 1).state_dict()
    with pytest.raises(CheckpointError, match="different model or num_classes"):
        load_model_state(model, other, "x.pt")
