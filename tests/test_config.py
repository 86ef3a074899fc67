"""Every conf/**/*.yaml option composes and instantiates; bad keys fail at compose time."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from conftest import CONF, make_cfg
from turbotrain.compression import apply_compression
from turbotrain.config import ConfigError
from turbotrain.config.validation import validate
from turbotrain.data import build_data
from turbotrain.data.loader import EpochSampler, build_loader
from turbotrain.models import build_model
from turbotrain.models.attention.options import NAME as ATTENTION_NAME
from turbotrain.train import distributed
from turbotrain.train.optim import build_optimizer
from turbotrain.train.precision import build_precision, native_bf16_cpu
from turbotrain.train.sched import build_scheduler
from turbotrain.train.tracking import Tracker

GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir())
OPTIONS = [(g, f.stem) for g in GROUPS for f in sorted((CONF / g).glob("*.yaml"))]


def test_required_groups_exist():
    required = {"data", "model", "precision", "attention", "compression", "distributed", "deploy"}
    supporting = {"optim", "sched", "loader", "logger", "profiler", "experiment"}
    assert required | supporting <= set(GROUPS)


TEXT_OPTIONS = {
    ("attention", "full"),
    ("data", "wordnet"),
    ("data", "text_files"),
    ("data", "hf_hub"),
    ("model", "minilm"),
    ("model", "hf"),
    ("model", "bert_tiny"),
    ("attention", "sliding_window"),
    ("compression", "embed_lowrank"),
    ("experiment", "wordnet_minilm"),
    ("experiment", "wordnet_speedrun"),
}


def _text_option(group, option, tmp_path):
    from turbotrain.compression.lowrank import factorize
    from turbotrain.models import build_for, build_tokenizer_for
    from turbotrain.models.attention.options import apply_attention
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
    assert TEXT_SPECIFIC[group, option](cfg, data, model), f"{group}={option}: its specific check failed"


def _layers(model) -> int:
    return model.config.num_hidden_layers


TEXT_SPECIFIC = {
    ("attention", "full"): lambda cfg, data, model: model.config._attn_implementation == "sdpa",
    ("attention", "sliding_window"): lambda cfg, data, model: model.config._attn_implementation == ATTENTION_NAME,
    ("compression", "embed_lowrank"): lambda cfg, data, model: "LowRankEmbedding" in _modules(model),
    ("data", "wordnet"): lambda cfg, data, model: (
        data.class_names == ["act", "animal", "artifact", "communication", "person", "plant"]
    ),
    ("data", "text_files"): lambda cfg, data, model: sorted(data.class_names) == ["boat", "fruit"],
    ("model", "minilm"): lambda cfg, data, model: (_layers(model), model.config.hidden_size) == (6, 384),
    ("model", "hf"): lambda cfg, data, model: (_layers(model), model.config.hidden_size) == (6, 384),
    ("model", "bert_tiny"): lambda cfg, data, model: _layers(model) == 2,
    ("experiment", "wordnet_minilm"): lambda cfg, data, model: (
        (_layers(model), cfg.optim.name, cfg.data.bucket_by_length) == (6, "adamw", True)
    ),
    ("experiment", "wordnet_speedrun"): lambda cfg, data, model: (
        (
            model.get_input_embeddings().weight.requires_grad,
            [next(block.parameters()).requires_grad for block in model.bert.encoder.layer],
            {m.p for n, m in model.named_modules() if type(m).__name__ == "Dropout" and not n.endswith("self.dropout")},
            cfg.trainer.max_steps,
        )
        == (True, [False, True, True], {0.0}, 800)
    ),
}


def _modules(model) -> set[str]:
    return {type(m).__name__ for m in model.modules()}


def _lrs(b, steps=12) -> list[float]:
    lrs = []
    for _ in range(steps):
        lrs.append(b["opt"].param_groups[0]["lr"])
        b["opt"].step()
        if b["sched"] is not None:
            b["sched"].step()
    return lrs


def _profile(b):
    from turbotrain.train.profiling import profiler

    with profiler(b["cfg"].profiler, b["tmp"], torch.device("cpu"), True) as step:
        for _ in range(14):
            b["model"](torch.randn(2, 3, 32, 32))
            if step is not None:
                step()
    return sorted(p.name for p in (b["tmp"] / "profiler").iterdir()) if (b["tmp"] / "profiler").exists() else []


def _quantized(b, name):
    from turbotrain.deploy.export import quantize_for

    model = b["model"].eval()
    calib = [(torch.randn(4, 3, 32, 32), torch.zeros(4)) for _ in range(2)]
    return quantize_for(name, model, "image", calib, torch.randn(4, 3, 32, 32), batches=2)[0]


def _fast_cnn(b, widths: list[int], epochs: int) -> bool:
    convs = [m.out_channels for m in b["model"].modules() if isinstance(m, torch.nn.Conv2d)][1:]  # after the stem
    return convs == widths and b["cfg"].trainer.max_epochs == epochs


def _onnx(b, name) -> bool:
    from turbotrain.deploy.quantize import DEPLOY

    return DEPLOY[name].traits["format"] == "onnx" and _quantized(b, name) is b["model"]


def _fused_per_channel(q) -> bool:
    convs = [m for m in q.modules() if type(m).__name__ == "ConvReLU2d" and hasattr(m, "weight")]
    return (
        bool(convs) and all(c.weight().qscheme() == torch.per_channel_affine for c in convs) and "BatchNorm2d" not in _modules(q)
    )


def _dynamic_linear_only(q) -> bool:
    linears = [m for m in q.modules() if type(m).__name__ == "Linear"]
    convs_float = all(type(m) is torch.nn.Conv2d for m in q.modules() if "Conv" in type(m).__name__)
    return bool(linears) and all("quantized.dynamic" in type(m).__module__ for m in linears) and convs_float


def _channel_prune(b):
    from turbotrain.compression.prune import channel_prune

    return channel_prune(b["model"].eval(), torch.randn(1, 3, 32, 32), b["cfg"].compression)["macs_reduction"]


def _weight_prune(b):
    from turbotrain.compression.prune import weight_prune

    return weight_prune(b["model"], b["cfg"].compression.sparsity)["sparsity"]


def _conv_lowrank(b) -> float:
    """MACs reduction of conv_lowrank at its default rank ratio on the default model."""
    from turbotrain.compression import COMPRESSION
    from turbotrain.compression.compress import Surgery

    option = COMPRESSION["conv_lowrank"]
    return option.build(b["model"].eval(), b["cfg"].compression, Surgery(torch.randn(1, 3, 32, 32)))["macs_reduction"]


def _hydra(option):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=[f"hparams_search={option}"], return_hydra_config=True).hydra


# (group, option) -> a check of what that option, and no other, does (b: what the test built)
SPECIFIC = {
    ("compression", "none"): lambda b: apply_compression(b["model"], b["cfg"].compression, example=None, evaluate=None) is None,
    ("compression", "channel_prune"): lambda b: 0.3 <= _channel_prune(b) < 0.6,
    ("compression", "weight_prune"): lambda b: abs(_weight_prune(b) - 0.5) < 0.01,
    ("compression", "conv_lowrank"): lambda b: 0.5 < _conv_lowrank(b) < 0.9,
    ("data", "fashion_mnist"): lambda b: (
        (b["data"].in_channels, b["image"].shape[-1], b["data"].class_names[0]) == (1, 28, "T-shirt/top")
    ),
    ("data", "imagenet"): lambda b: b["data"].class_names == ["china", "flower"] and b["image"].shape[0] == 3,
    ("data", "webdataset"): lambda b: (
        b["data"].class_names == ["china", "flower"]
        and b["data"].train.dataset.source.name(0).endswith("train-000000.tar:000000000")
    ),
    ("data", "hf_images"): lambda b: (
        b["data"].class_names == ["china", "flower"] and b["data"].val.dataset.source.name(0) == "split validation row 0"
    ),
    ("data", "digits"): lambda b: b["image"].shape == (1, 8, 8) and len(b["data"].train) + len(b["data"].val) == 1797,
    ("data", "synthetic"): lambda b: len(b["data"].train) + len(b["data"].val) == 1024 and b["image"].shape == (3, 32, 32),
    ("deploy", "fp32"): lambda b: _quantized(b, "fp32") is b["model"],
    ("deploy", "int8"): lambda b: _fused_per_channel(_quantized(b, "int8")),
    ("deploy", "int8_dynamic"): lambda b: _dynamic_linear_only(_quantized(b, "int8_dynamic")),
    # ONNX Runtime quantizes the exported graph, not the module (tests/test_onnx.py)
    ("deploy", "onnx"): lambda b: _onnx(b, "onnx"),
    ("deploy", "onnx_int8"): lambda b: _onnx(b, "onnx_int8"),
    ("distributed", "none"): lambda b: distributed.setup(b["cfg"].distributed, "cpu")[0].world_size == 1,
    ("distributed", "ddp"): lambda b: (b["cfg"].distributed.nproc, b["cfg"].distributed.backend) == (2, "auto"),
    ("experiment", "resnet18_fashion"): lambda b: "BasicBlock" in _modules(b["model"]) and b["cfg"].data.image_size == 64,
    ("experiment", "speedrun"): lambda b: (
        _fast_cnn(b, [16, 48, 96], epochs=2) and b["cfg"].data.augment[0].name == "AlternatingHorizontalFlip"
    ),
    ("experiment", "speedrun_93"): lambda b: (
        _fast_cnn(b, [32, 64, 128], epochs=5) and b["cfg"].data.augment[0].name == "AlternatingHorizontalFlip"
    ),
    ("hparams_search", "optuna"): lambda b: "optuna" in _hydra("optuna").sweeper._target_,
    ("hparams_search", "random"): lambda b: (
        lambda h: (h.sweeper.sampler._target_, h.sweeper.sampler.seed) == ("optuna.samplers.RandomSampler", 0)
    )(_hydra("random")),
    ("loader", "default"): lambda b: (b["loader"].num_workers, b["loader"].prefetch_factor) == (0, None),
    ("loader", "tuned"): lambda b: (
        (b["loader"].num_workers, b["loader"].prefetch_factor, b["loader"].persistent_workers) == (2, 4, True)
    ),
    ("logger", "none"): lambda b: b["logger"] is None,
    ("logger", "wandb"): lambda b: type(b["logger"]).__name__ == "WandbLogger",
    ("logger", "tensorboard"): lambda b: any((b["tmp"] / "tensorboard").iterdir()),
    ("model", "small_cnn"): lambda b: type(b["model"]).__name__ == "SmallCNN",
    ("model", "fast_cnn"): lambda b: type(b["model"]).__name__ == "FastCNN" and not b["model"][0].conv.weight.requires_grad,
    ("model", "resnet18"): lambda b: "BasicBlock" in _modules(b["model"]) and "Bottleneck" not in _modules(b["model"]),
    ("model", "resnet50"): lambda b: "Bottleneck" in _modules(b["model"]),
    ("model", "mobilenet_v3_small"): lambda b: type(b["model"]).__name__ == "MobileNetV3",
    ("model", "efficientnet_b0"): lambda b: type(b["model"]).__name__ == "EfficientNet",
    ("optim", "sgd"): lambda b: isinstance(b["opt"], torch.optim.SGD) and b["opt"].defaults["nesterov"],
    ("optim", "adam"): lambda b: type(b["opt"]) is torch.optim.Adam,
    ("optim", "adamw"): lambda b: type(b["opt"]) is torch.optim.AdamW,
    ("optim", "rmsprop"): lambda b: type(b["opt"]) is torch.optim.RMSprop,
    ("optim", "adagrad"): lambda b: type(b["opt"]) is torch.optim.Adagrad,
    ("precision", "fp32"): lambda b: b["precision"].dtype is None,
    ("precision", "bf16"): lambda b: b["precision"].dtype is torch.bfloat16,
    ("precision", "fp16"): lambda b: b["precision"].dtype is torch.float16 and b["precision"].scaler.get_scale() == 65536.0,
    ("precision", "amp"): lambda b: b["precision"].dtype is (torch.bfloat16 if native_bf16_cpu() else None),
    ("profiler", "none"): lambda b: _profile(b) == [],
    ("profiler", "torch"): lambda b: "trace.json" in _profile(b),
    ("sched", "none"): lambda b: len(set(_lrs(b))) == 1,
    ("sched", "cosine"): lambda b: (lambda lr: lr == sorted(lr) and lr[0] < lr[-1])(_lrs(b)),  # warm-up: 19 of 20 steps
    ("sched", "cyclic"): lambda b: type(b["sched"]).__name__ == "CyclicLR",
    ("sched", "onecycle"): lambda b: type(b["sched"]).__name__ == "OneCycleLR",
    ("sched", "exponential"): lambda b: (lambda lr: lr[5] == pytest.approx(0.9 * lr[0]) and lr[7] < lr[6])(_lrs(b)),
    ("sched", "step"): lambda b: (lambda lr: lr[5] == pytest.approx(0.1 * lr[4]))(_lrs(b)),
}


def test_every_option_has_a_specific_check():
    assert set(OPTIONS) - TEXT_OPTIONS == set(SPECIFIC)
    assert TEXT_OPTIONS - {("data", "hf_hub")} == set(TEXT_SPECIFIC)  # hf_hub: its offline error is checked


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_composes_and_instantiates(group, option, jpeg_tree, jpeg_formats, tmp_path):
    if (group, option) in TEXT_OPTIONS:
        _text_option(group, option, tmp_path)
        return
    overrides = [f"{group}={option}", "data.batch_size=8"]
    if group == "data" and option in ("imagenet", "webdataset", "hf_images"):
        root = {"imagenet": jpeg_tree, "webdataset": jpeg_formats / "shards", "hf_images": jpeg_formats / "disk"}[option]
        overrides += [f"data.root={root}", f"data.cache_dir={tmp_path / 'cache'}"]
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
    logger = tracker._logger  # close() lets go of it
    tracker.close()
    built = {
        "cfg": cfg,
        "data": data,
        "image": image,
        "model": model,
        "opt": opt,
        "sched": sched,
        "loader": loader,
        "precision": build_precision(cfg.precision, torch.device("cpu")),
        "logger": logger,
        "tmp": tmp_path,
    }
    assert SPECIFIC[group, option](built), f"{group}={option}: its specific check failed"


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


def test_fp16_grad_scaler_takes_init_scale_and_growth_interval():
    cfg = make_cfg("precision=fp16", "precision.init_scale=1024", "precision.growth_interval=7")
    scaler = build_precision(cfg.precision, torch.device("cpu")).scaler
    assert (scaler.get_scale(), scaler.get_growth_interval()) == (1024.0, 7)
