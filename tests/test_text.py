"""The text path end to end: WordNet topics, user files, sliding window, low rank, export."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from conftest import make_cfg, run_cli
from turbotrain.config import ConfigError
from turbotrain.core.checkpoint import load
from turbotrain.data import build_data
from turbotrain.data.loader import EpochSampler
from turbotrain.data.text import WORDNET_TOPICS, read_wordnet
from turbotrain.models import build_for, build_tokenizer_for
from turbotrain.train.run import train

TEXT = (
    "data=wordnet",
    "model=bert_tiny",
    "optim=adamw",
    "optim.lr=2e-3",
    "trainer.channels_last=false",
    "trainer.progress_bar=false",
    "trainer.limit_val_batches=20",
)


def test_wordnet_has_six_balanced_enough_topics():
    texts, labels = read_wordnet()
    counts = torch.bincount(torch.tensor(labels))
    assert len(counts) == len(WORDNET_TOPICS) == 6 and len(texts) > 40_000
    assert counts.min() > 0.3 * counts.max()


def test_bert_tiny_learns_wordnet_topics(tmp_path):
    best = train(make_cfg(*TEXT, "data.bucket_by_length=true", "trainer.max_steps=150", "trainer.max_epochs=1"), tmp_path)
    assert best > 0.4  # 6 topics: chance is ~0.2 for the largest class


def _padding(order: list[int], lengths: list[int], batch: int) -> int:
    """Pad tokens when consecutive runs of `batch` indices are padded to their longest."""
    chunks = [order[i : i + batch] for i in range(0, len(order) - batch + 1, batch)]
    return sum(batch * max(lengths[j] for j in c) - sum(lengths[j] for j in c) for c in chunks)


def test_length_bucketing_is_a_seeded_permutation_with_little_padding():
    lengths = torch.randint(3, 64, (2000,), generator=torch.Generator().manual_seed(0)).tolist()
    plain = EpochSampler(2000, seed=1)
    bucketed = EpochSampler(2000, seed=1, lengths=lengths, batch_size=32)
    order = list(bucketed)
    assert sorted(order) == list(range(2000))  # every sample once
    assert order == list(EpochSampler(2000, seed=1, lengths=lengths, batch_size=32))  # seeded
    bucketed.set_epoch(1)
    assert list(bucketed) != order  # a new order every epoch
    assert _padding(order, lengths, 32) < 0.1 * _padding(list(plain), lengths, 32)
    # windows of 50 batches of the plain order, each cut from its longest: the last window's
    # remainder of 16, last and dropped in training, is its 16 shortest (the fewest tokens lost)
    last_window = sorted(list(plain)[1600:], key=lambda j: lengths[j], reverse=True)
    assert order[-16:] == last_window[-16:]
    bucketed.set_epoch(0, start=5 * 32)  # mid-epoch resume: the rest of the same order
    assert list(bucketed) == order[5 * 32 :]
    # DDP: each rank's batches are bucketed too, and the ranks split the samples
    ranks = [list(EpochSampler(2000, seed=1, rank=r, world_size=2, lengths=lengths, batch_size=32)) for r in (0, 1)]
    assert sorted(ranks[0] + ranks[1]) == list(range(2000))
    assert _padding(ranks[1], lengths, 32) < 0.1 * _padding(list(plain)[1::2], lengths, 32)


def test_validation_with_bucketing_runs_longest_first_on_every_rank():
    lengths = torch.randint(3, 64, (2001,), generator=torch.Generator().manual_seed(0)).tolist()
    ranks = [list(EpochSampler(2001, 0, shuffle=False, rank=r, world_size=2, pad=False, lengths=lengths)) for r in (0, 1)]
    assert sorted(ranks[0] + ranks[1]) == list(range(2001))  # every sample once, none twice
    for order in ranks:
        assert [lengths[j] for j in order] == sorted((lengths[j] for j in order), reverse=True)
    natural = list(EpochSampler(2001, 0, shuffle=False, pad=False))
    assert _padding(ranks[0], lengths, 64) < 0.1 * _padding(natural[0::2], lengths, 64)


def test_a_bucketed_run_validates_longest_first(tmp_path):
    from turbotrain.train.build import build
    from turbotrain.train.distributed import DistInfo
    from turbotrain.train.preemption import StopFlag

    texts = tmp_path / "texts.csv"
    rows = [f"{' '.join(['word'] * (i % 7 + 1))} about {w},{w}" for i in range(30) for w in ("cats", "ships")]
    texts.write_text("\n".join(["text,label", *rows]))
    data = ("data=text_files", f"data.train_path={texts}", f"data.val_path={texts}", "data.batch_size=4")
    parts = build(make_cfg(*TEXT[1:], *data, "data.bucket_by_length=true"), DistInfo(), torch.device("cpu"), StopFlag())
    lengths = [parts.data.val.lengths()[j] for j in parts.loaders.val.sampler]
    assert len(lengths) == 60 and lengths == sorted(lengths, reverse=True) and lengths[0] > lengths[-1]


def test_length_bucketing_is_for_text(tmp_path):
    with pytest.raises(ConfigError, match="data.bucket_by_length=true applies to text data"):
        train(make_cfg("data=digits", "data.bucket_by_length=true", "trainer.max_epochs=1"), tmp_path)


def test_sliding_window_run_with_extended_positions(tmp_path):
    cfg = make_cfg(
        *TEXT,
        "attention=sliding_window",
        "attention.window=16",
        "attention.checkpointing=true",
        "data.max_length=640",
        "trainer.max_steps=5",
        "trainer.max_epochs=1",
    )
    train(cfg, tmp_path)
    ckpt = load(tmp_path / "checkpoints" / "last.pt")
    assert ckpt["model"]["bert.embeddings.position_embeddings.weight"].shape[0] == 640


def _two_topic_files(tmp_path) -> tuple[str, ...]:
    """data= overrides for 32 short texts of two topics, training and validation alike."""
    texts = tmp_path / "texts.csv"
    rows = [f"a story about {w} number {i},{w}" for i in range(16) for w in ("cats", "ships")]
    texts.write_text("\n".join(["text,label", *rows]))
    return ("data=text_files", f"data.train_path={texts}", f"data.val_path={texts}", "data.max_length=16")


def test_frozen_embeddings_and_lowest_block_stay_as_loaded(tmp_path):
    data = _two_topic_files(tmp_path)
    frozen = ("model=minilm", "model.freeze_embeddings=true", "model.frozen_layers=1")
    cfg = make_cfg(*TEXT[1:], *data, *frozen, "trainer.max_steps=2", "trainer.max_epochs=1")
    train(cfg, tmp_path / "run")
    trained = load(tmp_path / "run" / "checkpoints" / "last.pt")["model"]
    tokenizer = build_tokenizer_for(cfg.model, 16)
    loaded = build_for(cfg.model, build_data(cfg.data, tokenizer), tokenizer, 16).state_dict()
    changed = {k for k, v in loaded.items() if not torch.equal(v, trained[k])}
    blocks = {k.split(".")[3] for k in changed if k.startswith("bert.encoder.layer.")}
    assert "bert.embeddings.word_embeddings.weight" not in changed
    assert blocks == {str(i) for i in range(1, 6)}  # MiniLM-L6: block 0 kept, the 5 above it trained
    assert "bert.embeddings.position_embeddings.weight" in changed  # only the token embeddings are frozen


@pytest.mark.parametrize("dropout", [None, 0.0])
def test_model_dropout_reaches_every_dropout_of_a_text_model_but_attention(dropout):
    from omegaconf import OmegaConf

    from turbotrain.models.attention.options import apply_attention

    cfg = make_cfg(*TEXT, "data.max_length=16", "attention.dropout=0", *([] if dropout is None else [f"model.dropout={dropout}"]))
    tokenizer = build_tokenizer_for(cfg.model, 16)
    model = build_for(cfg.model, OmegaConf.create({"kind": "text", "num_classes": 6, "in_channels": 0}), tokenizer, 16)
    apply_attention(model, cfg.attention)
    batch = tokenizer(["a small dog", "an old ship that sails"], padding=True, return_tensors="pt")
    model.train()
    torch.manual_seed(0)
    first = model(**batch).logits
    second = model(**batch).logits
    # train-mode forwards agree only when no dropout is left: the hidden states', the embeddings'
    # and the classifier's follow model.dropout, the attention probabilities' attention.dropout
    assert torch.equal(first, second) == (dropout == 0.0)


def test_model_layers_keeps_the_lowest_blocks_and_a_run_of_it_reloads(tmp_path):
    from omegaconf import OmegaConf

    shape = OmegaConf.create({"kind": "text", "num_classes": 2, "in_channels": 0})
    full_cfg, short_cfg = make_cfg("model=minilm"), make_cfg("model=minilm", "model.layers=4", "model.frozen_layers=1")
    tokenizer = build_tokenizer_for(full_cfg.model, 16)
    full, short = (build_for(c.model, shape, tokenizer, 16).eval() for c in (full_cfg, short_cfg))
    batch = tokenizer(["a small dog", "an old ship that sails the sea"], padding=True, return_tensors="pt")
    with torch.no_grad():
        reference = full.bert(**batch, output_hidden_states=True).hidden_states[4]  # the output of block 4 of 6
        torch.testing.assert_close(short.bert(**batch).last_hidden_state, reference, rtol=0, atol=0)
    assert len(short.bert.encoder.layer) == short.config.num_hidden_layers == 4
    assert [next(b.parameters()).requires_grad for b in short.bert.encoder.layer] == [False, True, True, True]
    short_run = ("model=minilm", "model.layers=2", "trainer.max_steps=2", "trainer.max_epochs=1")
    cfg = make_cfg(*TEXT[1:], *_two_topic_files(tmp_path), *short_run)
    train(cfg, tmp_path / "run")
    saved = load(tmp_path / "run" / "checkpoints" / "last.pt")["model"]
    assert {k.split(".")[3] for k in saved if k.startswith("bert.encoder.layer.")} == {"0", "1"}
    build_for(cfg.model, build_data(cfg.data, tokenizer), tokenizer, 16).load_state_dict(saved)  # strict: what export does


def test_frozen_or_kept_layers_beyond_the_model_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="model.frozen_layers=3: the model has 2 transformer blocks"):
        train(make_cfg(*TEXT, "model.frozen_layers=3", "trainer.max_steps=1"), tmp_path)
    with pytest.raises(ConfigError, match=r"model.layers=3: the model has 2 transformer blocks; set at most 2, or null for all"):
        train(make_cfg(*TEXT, "model.layers=3", "trainer.max_steps=1"), tmp_path)


@pytest.mark.slow  # real processes, ~20-50 s on a 2-core CPU: `python -m pytest -m slow`
def test_text_files_skip_bad_rows_and_export_int8(tmp_path):
    train_csv, val_csv = tmp_path / "train.csv", tmp_path / "val.csv"
    rows = ["text,label"] + [f"a story about {w} number {i},{w}" for i in range(40) for w in ("cats", "ships")]
    train_csv.write_text("\n".join([*rows, ",cats", "no label here,", "odd one,dragons"]) + "\n")
    val_csv.write_text("\n".join(rows[:21]) + "\n")
    run = tmp_path / "run"
    cfg = make_cfg(
        *TEXT[1:],
        "data=text_files",
        f"data.train_path={train_csv}",
        f"data.val_path={val_csv}",
        "data.batch_size=16",
        "sched.warmup_steps=0",
        "trainer.max_epochs=10",
    )
    assert train(cfg, run) > 0.9
    r = run_cli("export.py", "deploy=int8", f"run={run}", "deploy.latency_repeats=3")
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((run / "export" / "int8" / "report.json").read_text())
    assert report["dtype"].startswith("int8 (dynamic") and report["method"].startswith("trace")
    assert report["argmax_agreement"] >= 0.9 and report["input"]["dtype"] == "int64"
    code = (
        "import sys; sys.modules['turbotrain'] = None\n"
        "import torch\n"
        f"m = torch.jit.load({str(run / 'export' / 'int8' / 'model.pt')!r})\n"
        "ids = torch.full((2, 128), 0); ids[:, 0] = 101; mask = torch.zeros(2, 128, dtype=torch.long); mask[:, :5] = 1\n"
        "print(tuple(m(ids, mask).shape))\n"
    )
    p = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0 and "(2, 3)" in p.stdout, p.stderr[-2000:]  # cats, dragons, ships


@pytest.mark.slow  # real processes, ~20-50 s on a 2-core CPU: `python -m pytest -m slow`
def test_low_rank_run_round_trips_and_exports(tmp_path):
    run = tmp_path / "run"
    cfg = make_cfg(*TEXT, "compression=embed_lowrank", "compression.rank=16", "trainer.max_steps=20", "trainer.max_epochs=1")
    train(cfg, run)
    ckpt = load(run / "checkpoints" / "last.pt")
    assert ckpt["arch"]["lowrank"] == {"bert.embeddings.word_embeddings": 16}
    summary = json.loads((run / "summary.json").read_text())["compression"]
    assert summary["params_after"] < summary["params_before"]
    r = run_cli("export.py", "deploy=int8_dynamic", f"run={run}", "deploy.latency_repeats=3", "deploy.val_batches=2")
    assert r.returncode == 0, r.stderr[-3000:]


def test_text_and_image_mismatch_is_clear(tmp_path):
    with pytest.raises(ConfigError, match="pick a text model"):
        train(make_cfg("data=wordnet", "model=small_cnn"), tmp_path)
    with pytest.raises(ConfigError, match="transformer models"):
        train(make_cfg("data=digits", "attention=sliding_window"), tmp_path)


def test_non_utf8_bytes_are_replaced_or_named(tmp_path):
    from turbotrain.data.safe import DataError

    bad = tmp_path / "train.csv"
    bad.write_bytes(b"text,label\nplain words,a\nbroken \xff\xfe bytes,b\nmore words,a\nother,b\n")
    common = ("data=text_files", f"data.train_path={bad}", f"data.val_path={bad}", "model=bert_tiny")
    cfg = make_cfg(*common, "trainer.max_steps=1", "trainer.max_epochs=1", "trainer.progress_bar=false", "data.batch_size=2")
    train(cfg, tmp_path / "skip")
    assert json.loads((tmp_path / "skip" / "summary.json").read_text())["steps"] == 1  # it trained
    data = build_data(cfg.data, build_tokenizer_for(cfg.model, cfg.data.max_length))
    assert len(data.train) == 4  # the row with bad bytes is kept, its bytes replaced
    with pytest.raises(DataError, match="train.csv"):
        train(make_cfg(*common, "data.on_bad_sample=error"), tmp_path / "error")


def test_text_int8_is_dynamic_linear_with_weight_only_word_embeddings():
    from turbotrain.deploy.export import quantize_for
    from turbotrain.deploy.script import TextLogits

    cfg = make_cfg(*TEXT, "data.max_length=32")
    tokenizer = build_tokenizer_for(cfg.model, cfg.data.max_length)
    data = build_data(cfg.data, tokenizer)
    torch.manual_seed(0)
    model = TextLogits(build_for(cfg.model, data, tokenizer, cfg.data.max_length)).eval()
    q, dtype = quantize_for("int8", model, "text", calib=None, example=None, batches=0)
    words = q.model.bert.embeddings.word_embeddings
    assert type(words).__name__ == "Embedding" and "quantized" in type(words).__module__
    assert words.weight().qscheme() == torch.per_channel_affine_float_qparams  # one scale per row
    assert words.weight().dtype == torch.quint8
    linears = [m for n, m in q.named_modules() if type(m).__name__ == "Linear"]
    assert linears and all("quantized.dynamic" in type(m).__module__ for m in linears)
    assert isinstance(model.model.bert.embeddings.word_embeddings, torch.nn.Embedding)  # the float model is untouched
    inputs, _ = data.collate([data.val[i] for i in range(8)])
    args = (inputs["input_ids"], inputs["attention_mask"])
    with torch.no_grad():
        a, b = q(*args), model(*args)
    assert (a - b).abs().max() < 0.1 * b.abs().max() + 0.05, (a - b).abs().max()
