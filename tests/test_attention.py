"""Sliding-window attention against references, checkpointing, position extension, low rank."""

from __future__ import annotations

import copy

import pytest
import torch
from attention_reference import naive_banded
from omegaconf import OmegaConf
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from turbotrain.compression.lowrank import factorize
from turbotrain.models.attention.options import _hf_mask, apply_attention, extend_positions
from turbotrain.models.text import TextModelConfig, build_text_model

TOL = {"rtol": 1e-4, "atol": 1e-5}


def _bert(seed=0):
    torch.manual_seed(seed)
    model = build_text_model(OmegaConf.structured(TextModelConfig(name="bert_tiny")), 3, 128, vocab_size=1000)
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    return model


def _attn(**kw):
    base = {"name": "full", "implementation": "sdpa", "window": 8, "block": None, "global_tokens": 0}
    return OmegaConf.create({**base, "checkpointing": False, "dropout": None, **kw})


def _batch(n=50):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 1000, (3, n), generator=g)
    mask = torch.ones(3, n, dtype=torch.long)
    mask[2, 31:] = 0
    return {"input_ids": ids, "attention_mask": mask}, torch.tensor([0, 1, 2])


def _logits_and_grads(model, batch):
    model.zero_grad()
    inputs, y = batch
    logits = model(**inputs).logits
    nn.functional.cross_entropy(logits, y).backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same_logits_and_grads(model, reference, batch):
    a_logits, a_grads = _logits_and_grads(reference, batch)
    b_logits, b_grads = _logits_and_grads(model, batch)
    torch.testing.assert_close(b_logits, a_logits, **TOL)
    for name, g in a_grads.items():
        torch.testing.assert_close(b_grads[name], g, rtol=1e-3, atol=1e-5, msg=name)


def test_window_covering_the_sequence_equals_full_attention_logits_and_grads():
    full, sliding = _bert(), _bert()
    apply_attention(full, _attn())
    apply_attention(sliding, _attn(name="sliding_window", window=64, block=16, global_tokens=1))
    _assert_same_logits_and_grads(sliding, full, _batch())


def _dense_banded_kernel(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """The reference inside a real model: the dense n x n banded mask, through transformers'
    attention interface exactly where the sliding-window kernel sits."""
    cfg = module.config.turbotrain_attention
    keep = attention_mask if attention_mask is not None else torch.ones(query.shape[0], key.shape[2], dtype=torch.bool)
    return naive_banded(query, key, value, keep, cfg["window"], cfg["global_tokens"]), None


AttentionInterface.register("test_dense_banded", _dense_banded_kernel)
AttentionMaskInterface.register("test_dense_banded", _hf_mask)


@pytest.mark.parametrize(("window", "block", "global_tokens"), [(4, 4, 0), (6, 4, 1)])
def test_model_with_narrow_window_matches_dense_banded_mask(window, block, global_tokens):
    sliding, dense = _bert(), _bert()
    apply_attention(sliding, _attn(name="sliding_window", window=window, block=block, global_tokens=global_tokens))
    dense.config.turbotrain_attention = {"window": window, "block": block, "global_tokens": global_tokens}
    dense.set_attn_implementation("test_dense_banded")
    batch = _batch()
    _assert_same_logits_and_grads(sliding, dense, batch)
    full = _bert()
    apply_attention(full, _attn())
    hidden = {name: m.bert(**batch[0]).last_hidden_state for name, m in (("sliding", sliding), ("dense", dense), ("full", full))}
    real = batch[0]["attention_mask"].bool()  # padded positions' outputs are unused
    torch.testing.assert_close(hidden["sliding"][real], hidden["dense"][real], **TOL)
    assert (hidden["sliding"][real] - hidden["full"][real]).abs().max() > 1e-2  # the window really changes the model


def test_checkpointing_gives_the_same_gradients():
    plain, ckpt = _bert(), _bert()
    apply_attention(plain, _attn())
    apply_attention(ckpt, _attn(checkpointing=True))
    plain.train(), ckpt.train()
    batch = _batch()
    _, a = _logits_and_grads(plain, batch)
    _, b = _logits_and_grads(ckpt, batch)
    for name, g in a.items():
        torch.testing.assert_close(b[name], g, rtol=1e-5, atol=1e-7, msg=name)


def test_position_extension_keeps_short_inputs_unchanged():
    model = _bert().eval()
    inputs, _ = _batch(100)
    before = model(**inputs).logits
    assert extend_positions(model, 1024) == 512
    torch.testing.assert_close(model(**inputs).logits, before, rtol=0, atol=0)
    long = {"input_ids": torch.randint(5, 1000, (1, 1000)), "attention_mask": torch.ones(1, 1000, dtype=torch.long)}
    assert model(**long).logits.shape == (1, 3)


def test_full_rank_factorization_equals_original():
    model = _bert().eval()
    inputs, _ = _batch()
    before = model(**inputs).logits
    low = copy.deepcopy(model)
    report = factorize(low, "embedding", rank=64, energy=None)  # 64 = hidden size: full rank
    torch.testing.assert_close(low(**inputs).logits, before, rtol=1e-4, atol=1e-4)
    assert report["ranks"] == {"bert.embeddings.word_embeddings": 64}


def test_low_rank_cuts_embedding_params():
    model = _bert()
    emb_params = model.get_input_embeddings().weight.numel()
    report = factorize(model, "embedding", rank=16, energy=None)
    assert report["params_before"] - report["params_after"] > 0.7 * emb_params


@pytest.mark.parametrize("targets", ["linear", "both"])
def test_low_rank_linear_is_the_truncated_svd_and_round_trips(targets):
    from turbotrain.compression.lowrank import LowRankLinear, restore

    model = _bert().eval()
    original = {n: m.weight.detach().clone() for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    report = factorize(model, targets, rank=8, energy=None)
    linears = {n: r for n, r in report["ranks"].items() if n in original}
    assert set(linears) == {n for n in original if "classifier" not in n} and set(linears.values()) == {8}
    assert ("bert.embeddings.word_embeddings" in report["ranks"]) == (targets == "both")
    for name, weight in original.items():
        module = model.get_submodule(name)
        if "classifier" in name:
            assert isinstance(module, nn.Linear) and torch.equal(module.weight, weight)
            continue
        assert isinstance(module, LowRankLinear)
        u, s, vh = torch.linalg.svd(weight, full_matrices=False)
        torch.testing.assert_close(module[1].weight @ module[0].weight, (u[:, :8] * s[:8]) @ vh[:8], rtol=1e-4, atol=1e-5)
    fresh = _bert(seed=1)
    restore(fresh, report["ranks"])  # what resume and export do from a checkpoint's arch
    fresh.load_state_dict(model.state_dict())
    inputs, _ = _batch()
    torch.testing.assert_close(fresh.eval()(**inputs).logits, model(**inputs).logits, rtol=0, atol=0)
