"""Text classification data: wordnet (WordNet 3.0 noun definitions by topic), text_files, hf_hub.

Texts are tokenized once with the model's fast tokenizer (`datasets.map(batched=True)`) without
padding; batches are padded per batch to their longest text (dynamic padding).
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset

from turbotrain.core.schema import POSITIVE, UNIT_OPEN, ConfigError, setting
from turbotrain.data.bundle import DATA, DataBundle, DataCommon
from turbotrain.data.safe import DataError

log = logging.getLogger("turbotrain")


@dataclass
class TextDataConfig(DataCommon):
    batch_size: int = setting(32, bound=POSITIVE)
    max_length: int = setting(64, bound=POSITIVE)  # tokens; longer texts are truncated


@dataclass
class WordNetConfig(TextDataConfig):
    val_fraction: float = setting(0.1, bound=UNIT_OPEN)  # of the definitions, a fixed seeded split


@dataclass
class TextFilesConfig(TextDataConfig):
    max_length: int = setting(128, bound=POSITIVE)
    train_path: str | None = None  # required
    val_path: str | None = None  # required
    text_column: str = "text"  # the column holding the text
    label_column: str = "label"  # the column holding the labels


@dataclass
class HubDataConfig(TextDataConfig):
    max_length: int = setting(128, bound=POSITIVE)
    hub_name: str = "ag_news"  # e.g. data.hub_name=ag_news
    text_column: str = "text"  # the column holding the text
    label_column: str = "label"  # the column holding the labels


WORDNET = Path("/usr/share/wordnet/data.noun")
# Lexicographer files of nouns (lexnames(5WN)): six large, distinct topics.
WORDNET_TOPICS = {4: "act", 5: "animal", 6: "artifact", 10: "communication", 18: "person", 20: "plant"}


def read_wordnet(path: Path = WORDNET) -> tuple[list[str], list[int]]:
    """(definition, topic index) pairs from data.noun; examples in quotes are dropped."""
    if not path.is_file():
        raise ConfigError(f"data=wordnet needs {path}: apt-get install wordnet-base")
    topics = sorted(WORDNET_TOPICS)
    texts, labels = [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("  "):  # licence header
                continue
            head, _, gloss = line.partition(" | ")
            fields = head.split()
            lex = int(fields[1])
            if lex not in WORDNET_TOPICS:
                continue
            definition = gloss.split('; "')[0].strip()
            if definition:
                texts.append(definition)
                labels.append(topics.index(lex))
    return texts, labels


class TokenizedText(Dataset):
    """Items are ({input_ids, attention_mask} 1-D tensors, label)."""

    def __init__(self, encoded, labels: list[int]):
        self.encoded, self.labels = encoded, labels

    def __len__(self) -> int:
        return len(self.labels)

    def lengths(self) -> list[int]:
        return [len(ids) for ids in self.encoded["input_ids"]]

    def __getitem__(self, i: int):
        row = self.encoded[i]
        return {k: torch.tensor(v) for k, v in row.items()}, self.labels[i]


class PadCollate:
    """Pads each batch to its longest sequence, or to `length` (a class, so DataLoader workers can
    pickle it). Exported artifacts take fixed-length inputs: tracing bakes in the sequence length."""

    def __init__(self, pad_id: int, length: int | None = None):
        self.pad_id, self.length = pad_id, length

    def __call__(self, batch):
        inputs = {}
        for key in batch[0][0]:
            pad = self.pad_id if key == "input_ids" else 0
            seqs = [b[0][key] for b in batch]
            if self.length:
                seqs[0] = torch.nn.functional.pad(seqs[0], (0, self.length - len(seqs[0])), value=pad)
            inputs[key] = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=pad)
        return inputs, torch.tensor([b[1] for b in batch])


def _encode(tokenizer, texts: list[str], max_length: int):
    from datasets import Dataset as HFDataset
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    ds = HFDataset.from_dict({"text": texts})
    keep = ("input_ids", "attention_mask")  # token_type_ids: all zeros for one text, the model's default
    return ds.map(
        lambda batch: {k: v for k, v in tokenizer(batch["text"], truncation=True, max_length=max_length).items() if k in keep},
        batched=True,
        remove_columns=["text"],
    ).with_format(None)


def _split(texts, labels, seed: int, val_fraction: float):
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    n_val = int(len(order) * val_fraction)
    val, train = order[:n_val], order[n_val:]
    return ([texts[i] for i in train], [labels[i] for i in train]), ([texts[i] for i in val], [labels[i] for i in val])


def _read_files(cfg):
    """data=text_files: the user's train/val files through datasets.load_dataset."""
    from datasets import load_dataset

    files = {"train": cfg.train_path, "validation": cfg.val_path}
    for split, p in files.items():
        if not p or not Path(os.path.expanduser(p)).is_file():
            raise ConfigError(f"data.{'train' if split == 'train' else 'val'}_path={p!r}: no such file")
    ext = Path(cfg.train_path).suffix.lstrip(".")
    builder = {"csv": "csv", "tsv": "csv", "jsonl": "json", "json": "json", "parquet": "parquet"}.get(ext)
    if builder is None:
        raise ConfigError(f"data.train_path={cfg.train_path}: use .csv, .tsv, .jsonl or .parquet")
    kwargs = {"delimiter": "\t"} if ext == "tsv" else {}
    if builder != "parquet":  # undecodable bytes: U+FFFD when skipping bad samples, else an error
        kwargs["encoding_errors"] = "replace" if cfg.on_bad_sample == "skip" else "strict"
    try:
        return load_dataset(builder, data_files={k: os.path.expanduser(v) for k, v in files.items()}, **kwargs)
    except Exception as e:  # datasets wraps decoding errors in its own types
        cause = e.__cause__ or e.__context__ or e
        raise DataError(
            f"data.train_path/val_path: cannot read {cfg.train_path} / {cfg.val_path} "
            f"({type(cause).__name__}: {str(cause).splitlines()[0][:200]}); data.on_bad_sample=skip replaces bad bytes"
        ) from e


def _read_hub(cfg):
    """data=hf_hub: a dataset from the Hugging Face hub by name (online only)."""
    from datasets import load_dataset

    try:
        return load_dataset(cfg.hub_name)
    except Exception as e:  # offline, unknown name, ...
        raise ConfigError(f"data.hub_name={cfg.hub_name}: could not load it from the hub ({type(e).__name__}: {e})") from e


def _labelled(cfg, ds) -> tuple[tuple[list, list], tuple[list, list], list[str], int]:
    """(texts, label indices) of the train and validation splits of a datasets.DatasetDict, the
    class names, and how many rows were left out."""
    val_split = next((s for s in ("validation", "test") if s in ds), None)
    if "train" not in ds or val_split is None:
        raise ConfigError(f"data: need a train and a validation/test split, found {list(ds)}")
    for col in (cfg.text_column, cfg.label_column):
        if col not in ds["train"].column_names:
            raise ConfigError(f"data: column {col!r} not in {ds['train'].column_names} (data.text_column/label_column)")
    raw_labels = sorted({str(x) for x in ds["train"][cfg.label_column] if x is not None and str(x).strip()})
    index = {name: i for i, name in enumerate(raw_labels)}
    out, left_out = [], 0
    for split in ("train", val_split):
        texts, labels = [], []
        for text, label in zip(ds[split][cfg.text_column], ds[split][cfg.label_column]):
            if text is None or not str(text).strip() or label is None or str(label) not in index:
                continue  # empty text, missing or unknown label: skipped (counted below)
            texts.append(str(text))
            labels.append(index[str(label)])
        left_out += len(ds[split]) - len(texts)
        if len(texts) < len(ds[split]):
            log.warning(
                "data: skipped %d rows of %s with empty text or missing/unknown label",
                len(ds[split]) - len(texts),
                split,
            )
        out.append((texts, labels))
    return out[0], out[1], raw_labels, left_out


@DATA.register("wordnet", WordNetConfig, kind="text")
def wordnet(cfg, tokenizer) -> DataBundle:
    texts, labels = read_wordnet()
    train, val = _split(texts, labels, seed=1234, val_fraction=cfg.val_fraction)
    return _tokenized(cfg, tokenizer, train, val, [WORDNET_TOPICS[k] for k in sorted(WORDNET_TOPICS)])


@DATA.register("text_files", TextFilesConfig, kind="text")
def text_files(cfg, tokenizer) -> DataBundle:
    return _tokenized(cfg, tokenizer, *_labelled(cfg, _read_files(cfg)))


@DATA.register("hf_hub", HubDataConfig, kind="text")
def hf_hub(cfg, tokenizer) -> DataBundle:
    return _tokenized(cfg, tokenizer, *_labelled(cfg, _read_hub(cfg)))


def _tokenized(cfg, tokenizer, train, val, class_names: list[str], left_out: int = 0) -> DataBundle:
    datasets = [TokenizedText(_encode(tokenizer, t, cfg.max_length), lab) for t, lab in (train, val)]
    return DataBundle(
        train=datasets[0],
        val=datasets[1],
        train_eval=datasets[0],
        num_classes=len(class_names),
        class_names=class_names,
        kind="text",
        collate=PadCollate(tokenizer.pad_token_id or 0),
        bad_indexed=left_out,
    )
