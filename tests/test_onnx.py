"""deploy=onnx / onnx_int8: the fp32 graph equals eager on real batches of two sizes, a wrong model
fails the check, the INT8 graph holds quantized ops, and the artifact runs where torch cannot."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import make_cfg, run_cli
from test_export import DIGITS, _eager_and_val
from turbotrain.deploy import onnx as ox
from turbotrain.deploy.export import export
from turbotrain.train.run import train

TEXT = ("data=wordnet", "model=bert_tiny", "optim=adamw", "optim.lr=2e-3", "trainer.channels_last=false")


@pytest.fixture(scope="module")
def digits_onnx(tmp_path_factory):
    run = tmp_path_factory.mktemp("outputs") / "train" / "digits"
    train(make_cfg(*DIGITS, "trainer.max_epochs=6"), run)
    for deploy in ("onnx", "onnx_int8"):  # in this process: the text test below runs export.py itself
        export(make_cfg(f"deploy={deploy}", f"run={run}", "deploy.latency_repeats=3", config_name="export"))
    return run


def _report(run, deploy: str) -> dict:
    return json.loads((run / "export" / deploy / "report.json").read_text())


def test_onnx_fp32_equals_eager_on_real_batches_of_two_sizes(digits_onnx):
    model, x = _eager_and_val(digits_onnx)
    sess = ox.session(digits_onnx / "export" / "onnx" / "model.onnx", threads=2)
    with torch.no_grad():
        for batch in (x[:32], x[32:37]):  # the batch dimension is free
            np.testing.assert_allclose(ox.run(sess, (batch,), False), model(batch).numpy(), atol=ox.PARITY_ATOL)
    report = _report(digits_onnx, "onnx")
    assert report["fp32_max_abs_diff"] <= ox.PARITY_ATOL and report["format"] == "onnx" and report["opset"] >= 18
    assert report["val_acc1"] == pytest.approx(report["fp32_val_acc1"], abs=0.003)
    assert {"latency_ms", "latency_ms_b32", "fp32_latency_ms", "torchscript_int8_latency_ms"} <= set(report)


def test_a_model_that_the_graph_does_not_compute_fails_the_parity_check(digits_onnx):
    model, x = _eager_and_val(digits_onnx)
    sess = ox.session(digits_onnx / "export" / "onnx" / "model.onnx", threads=2)
    assert ox.check_parity(sess, model, [(x[:16],)], False, "small_cnn") <= ox.PARITY_ATOL
    with torch.no_grad():
        model[-1].bias.add_(0.5)  # the artifact of another model, as a mistranslated operator would be
    with pytest.raises(ox.ParityError, match=r"ONNX export of small_cnn differs from the model by 0\.5"):
        ox.check_parity(sess, model, [(x[:16],)], False, "small_cnn")


def test_onnx_int8_holds_quantized_ops_and_keeps_its_accuracy(digits_onnx):
    report = _report(digits_onnx, "onnx_int8")
    path = digits_onnx / "export" / "onnx_int8" / "model.onnx"
    counted = ox.quantized_ops(path)
    assert counted == report["quantized_ops"] and counted["QuantizeLinear"] > 0 and counted["DequantizeLinear"] > 0
    assert report["fp32_val_acc1"] - report["val_acc1"] <= 0.03
    assert report["size_mb"] < report["onnx_fp32_size_mb"]
    assert report["activation_weight_types"] in report["candidates_ms"] and report["reduce_range"] == (not ox.has_vnni())


FRESH = """
import sys
sys.modules["torch"] = None  # importing torch fails in this process
import numpy as np, onnxruntime as ort
sess = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
np.save(sys.argv[3], sess.run(["logits"], {"images": np.load(sys.argv[2])})[0])
"""


def test_the_int8_artifact_runs_where_torch_cannot_be_imported(digits_onnx, tmp_path):
    _, x = _eager_and_val(digits_onnx)
    path = digits_onnx / "export" / "onnx_int8" / "model.onnx"
    np.save(tmp_path / "x.npy", x[:9].numpy())
    r = subprocess.run(
        [sys.executable, "-I", "-c", FRESH, str(path), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    here = ox.run(ox.session(path, threads=2), (x[:9],), False)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), here, atol=1e-5)


def test_compressed_runs_export_the_same_way(tmp_path):
    """A channel-pruned and a conv_lowrank run (rebuilt from their checkpoints) pass the parity
    check against their own eager model and are quantized."""
    base = tmp_path / "base"
    train(make_cfg(*DIGITS, "trainer.max_epochs=2"), base)
    methods = {
        "channel_prune": ("compression.steps=2", "compression.finetune_steps=3"),
        "conv_lowrank": ("compression.rank_ratio=0.25",),
    }
    for method, keys in methods.items():
        run = tmp_path / method
        train(make_cfg(*DIGITS, "trainer.max_epochs=1", f"compression={method}", f"compression.from_run={base}", *keys), run)
        export(make_cfg("deploy=onnx_int8", f"run={run}", "deploy.latency_repeats=3", config_name="export"))
        report = _report(run, "onnx_int8")
        assert report["fp32_max_abs_diff"] <= ox.PARITY_ATOL, method
        assert report["quantized_ops"]["QuantizeLinear"] > 0 and report["size_mb"] < report["onnx_fp32_size_mb"], method
        assert report["fp32_val_acc1"] - report["val_acc1"] <= 0.03, method


@pytest.mark.slow  # a text model through the dynamo exporter and dynamic INT8: ~1 minute
def test_a_text_model_exports_with_free_batch_and_length(tmp_path):
    run = tmp_path / "outputs" / "train" / "text"
    train(make_cfg(*TEXT, "trainer.max_steps=60", "trainer.max_epochs=1", "trainer.progress_bar=false"), run)
    r = run_cli("export.py", "deploy=onnx_int8", f"run={run}", "deploy.latency_repeats=3", "deploy.val_batches=4")
    assert r.returncode == 0, r.stderr[-3000:]
    out = run / "export" / "onnx_int8"
    report = json.loads((out / "report.json").read_text())
    assert report["quantized_ops"].get("DynamicQuantizeLinear", 0) + report["quantized_ops"].get("MatMulInteger", 0) > 0
    import onnx

    graph = onnx.load(str(out / "model.onnx")).graph
    tables = [t for t in graph.initializer if "word_embeddings" in t.name and len(t.dims) == 2]  # not its scale
    assert len(tables) == 1 and tables[0].data_type in (onnx.TensorProto.UINT8, onnx.TensorProto.INT8)  # 8-bit too
    readme = (out / "README.txt").read_text()
    assert (out / "tokenizer").is_dir() and "AutoTokenizer" in readme and "max_length=64," in readme
    sess = ox.session(out / "model.onnx", threads=2)
    for batch, length in ((3, 9), (5, 17)):
        ids = torch.randint(1000, 2000, (batch, length))
        logits = ox.run(sess, (ids, torch.ones_like(ids)), True)
        assert logits.shape == (batch, 6) and np.isfinite(logits).all()  # the six WordNet topics
