"""Every conf/**/*.yaml option composes and instantiates; bad keys fail at compose time."""

from __future__ import annotations

import pytest
import torch
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from conftest import CONF, make_cfg
from turbotrain.config import ConfigError
from turbotrain.data import build_data
from turbotrain.data.loader import EpochSampler, build_loader
from turbotrain.models import build_model
from turbotrain.optim import build_optimizer
from turbotrain.precision import build_precision
from turbotrain.sched import build_scheduler
from turbotrain.tracking import Tracker
from turbotrain.validation import validate

GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir())
OPTIONS = [(g, f.stem) for g in GROUPS for f in sorted((CONF / g).glob("*.yaml"))]


def test_required_groups_exist():
    required = {"data", "model", "precision", "attention", "compression", "distributed", "deploy"}
    supporting = {"optim", "sched", "loader", "logger", "profiler", "experiment"}
    assert required | supporting <= set(GROUPS)


TEXT_OPTIONS = {
    ("data", "wordnet"),
    ("data", "text_files"),
    ("data", "hf_hub"),
    ("model", "minilm"),
    ("model", "hf"),
    ("model", "bert_tiny"),
    ("attention", "sliding_window"),
    ("compression", "embed_lowrank"),
    ("experiment", "wordnet_minilm"),
}


def _text_option(group, option, tmp_path):
    from turbotrain.attention import apply_attention
    from turbotrain.compression.lowrank import factorize
    from turbotrain.models import build_for, build_tokenizer_for
    from turbotrain.models.text import model_path

    overrides = [f"{group}={option}", "data.max_length=32"]
    if group != "data" and group != "experiment":
        overrides.append("data=wordnet")
    if group != "model" and group != "experiment":
        overrides.append("model=bert_tiny")
    if (group, option) == ("data", "text_files"):
        csv = tmp_path / "t.csv"
        csv.write_text("text,label\nred apples,fruit\nold ships,boat\n")
        overrides += [f"data.train_path={csv}", f"data.val_path={csv}"]
    if (group, option) == ("model", "hf"):
        overrides.append(f"model.path={model_path(make_cfg('model=minilm').model)}")
    cfg = make_cfg(*overrides)
    validate(cfg)
    tokenizer = build_tokenizer_for(cfg.model, cfg.data.max_length)
    if (group, option) == ("data", "hf_hub"):
        with pytest.raises(ConfigError, match="data.hub_name"):  # offline here: a clear error
            build_data(cfg.data, tokenizer)
        return
    data = build_data(cfg.data, tokenizer)
    model = build_for(cfg.model, data, tokenizer, cfg.data.max_length)
    apply_attention(model, cfg.attention)
    if cfg.compression.name == "embed_lowrank":
        factorize(model, cfg.compression.targets, cfg.compression.rank, cfg.compression.energy)
    inputs, labels = data.collate([data.val[0], data.val[1]])
    assert model(**inputs).logits.shape == (2, data.num_classes)


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_composes_and_instantiates(group, option, jpeg_tree, tmp_path):
    if (group, option) in TEXT_OPTIONS:
        _text_option(group, option, tmp_path)
        return
    overrides = [f"{group}={option}", "data.batch_size=8"]
    if group == "data" and option == "imagenet":
        overrides.append(f"data.root={jpeg_tree}")
    if group == "logger":
        overrides.append("logger.mode=disabled")
    cfg = make_cfg(*overrides)
    validate(cfg)
    data_cfg = cfg.data if group == "data" else make_cfg("data=synthetic", "data.num_samples=64").data
    data = build_data(data_cfg)
    image, label = data.train[0]
    assert image.shape[0] == data.in_channels
    model = build_model(cfg.model, data.num_classes, data.in_channels)
    model.eval()
    size = max(32, data.image_size)
    out = model(torch.randn(2, data.in_channels, size, size))
    assert out.shape == (2, data.num_classes)
    opt = build_optimizer(model, cfg.optim)
    sched = build_scheduler(opt, cfg.sched, cfg.optim, total_steps=20, steps_per_epoch=5)
    for _ in range(3):
        opt.step()
        if sched is not None:
            sched.step()
    assert opt.param_groups[0]["lr"] > 0
    build_precision(cfg.precision, torch.device("cpu"))
    loader = build_loader(
        data.train,
        batch_size=4,
        sampler=EpochSampler(len(data.train), 0),
        loader_cfg=cfg.loader,
        device=torch.device("cpu"),
        train=True,
        collate_fn=data.collate,
    )
    x, y, *_ = next(iter(loader))
    assert x.shape[0] == 4 and y.shape == (4,) and x.dtype == torch.float32
    tracker = Tracker(tmp_path, enabled=True, logger_cfg=cfg.logger, config={})
    tracker.log(step=0, split="train", loss=1.0)
    tracker.close()
    assert cfg.deploy.name in {"int8", "int8_dynamic", "fp32"}


def test_misspelt_key_fails_at_compose():
    with pytest.raises(ConfigCompositionException) as e:
        make_cfg("data.bathc_size=3")
    assert "Key 'bathc_size' not in 'DataConfig'" in str(e.value.__cause__)


def test_appended_unknown_key_fails_validation():
    # `+key=value` bypasses the schema at compose time; validate still names it.
    with pytest.raises(ConfigError, match=r"unknown key trainer\.max_epoch\b"):
        validate(make_cfg("+trainer.max_epoch=3"))


def test_wrong_type_fails_at_compose():
    with pytest.raises(ConfigCompositionException) as e:
        make_cfg("data.batch_size=lots")
    assert isinstance(e.value.__cause__, ValidationError)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("precision.name=fp8", "precision.name"),
        ("optim.lr=-0.1", "optim.lr"),
        ("data.batch_size=0", "data.batch_size"),
        ("trainer.accum_bn=sometimes", "trainer.accum_bn"),
        ("data.resolution_scale=[1.2,0.8]", "data.resolution_scale"),
        ("data.progressive_start=0", "data.progressive_start"),
        ("data.progressive_from=0.9", "data.progressive_from"),  # after progressive_until (0.8)
    ],
)
def test_validate_names_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(make_cfg(override))
