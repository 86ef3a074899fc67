"""What every data option produces (DataBundle), the keys every data option has (DataCommon), and
the data registry with `build_data`, which picks the registered builder."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch.utils.data import Dataset

from turbotrain.core.registry import Registry
from turbotrain.core.schema import NON_NEGATIVE, POSITIVE, ConfigError, setting
from turbotrain.models.catalog import MODELS

DATA = Registry("data")


@dataclass
class DataCommon:
    name: str = "fashion_mnist"  # the option (data=<name>)
    root: str | None = setting(None, numeric=False)  # where the data lives, not what it is
    # where downloads, listings, shard indexes and decoded caches go
    cache_dir: str = setting("~/.cache/turbotrain", numeric=False)
    download: bool = setting(True, numeric=False)  # fetch the dataset when it is not under data.root
    batch_size: int = setting(128, bound=POSITIVE)  # samples per training batch, per process under DDP
    eval_batch_size: int | None = setting(None, bound=POSITIVE, numeric=False)  # None: twice batch_size
    on_bad_sample: str = setting("skip", choices=("skip", "error"))  # skip: count + warn, naming files
    bucket_by_length: bool = False  # text: batches of similar-length texts (less padding; seeded order), validation longest first
    # images: whole training batches mixed on the device after augmentation (soft targets); 0 = off,
    # both > 0: each batch takes one of the two at random
    mixup_alpha: float = setting(0.0, bound=NON_NEGATIVE)
    cutmix_alpha: float = setting(0.0, bound=NON_NEGATIVE)  # CutMix's Beta(alpha, alpha) for whole training batches; 0: off


@dataclass
class DataBundle:
    train: Dataset
    val: Dataset
    num_classes: int
    kind: str = "image"  # image | text
    in_channels: int = 0  # images
    image_size: int = 0  # images: the nominal side in pixels
    mean: list[float] = field(default_factory=list)  # images: per-channel normalization
    std: list[float] = field(default_factory=list)
    class_names: list[str] = field(default_factory=list)
    class_files: dict[str, str] | None = None  # image folders: per class, a digest of its training files
    train_eval: Dataset | None = None  # training samples with eval transforms (INT8 calibration)
    collate: Callable | None = None
    # data.decode=gpu: (train loader, device=) -> the loader whose batches it decodes on that device
    train_on_device: Callable | None = None
    # samples the readers left out while listing both splits (malformed, unlabelled): summary.json's
    # bad_samples_indexed, once per run (bad_samples counts decode failures, each time one is read)
    bad_indexed: int = 0


def build_data(data_cfg, tokenizer=None) -> DataBundle:
    """The configured dataset. Text data needs the model's tokenizer; image data takes none."""
    option = DATA.of(data_cfg)
    if option.kind == "text" and tokenizer is None:
        raise ConfigError(f"data={option.name} is text: pick a text model (model={' or '.join(_text_models())})")
    if option.kind == "image" and tokenizer is not None:
        raise ConfigError(f"data={option.name} is images: pick an image model, not a text one")
    return option.build(data_cfg, tokenizer)


def _text_models() -> list[str]:
    return MODELS.names("text")
