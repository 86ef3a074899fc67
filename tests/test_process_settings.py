"""train() applies its config's process-wide settings before its first work: the thread count (from
the data's loading on, not only from the training steps) and the allocator (what each does is
measured in test_allocator.py and bench/)."""

import torch

from conftest import TINY, make_cfg
from turbotrain.train import build as build_module
from turbotrain.train import run as run_module
from turbotrain.train.numerics import set_threads
from turbotrain.train.run import train


def test_a_run_takes_its_thread_count_and_allocator_from_the_config(tmp_path, monkeypatch):
    threads = 1 if torch.get_num_threads() > 1 else 2
    modes, while_loading = [], []
    real_build_data = build_module.build_data

    def build_data(*args):
        while_loading.append(torch.get_num_threads())
        return real_build_data(*args)

    monkeypatch.setattr(run_module, "configure_malloc", modes.append)  # the calls as the run makes them
    monkeypatch.setattr(build_module, "build_data", build_data)
    try:
        train(make_cfg(*TINY, "trainer.max_epochs=1", f"trainer.threads={threads}", "trainer.malloc=system"), tmp_path)
        assert torch.get_num_threads() == threads
    finally:
        set_threads(None)
    assert (modes, while_loading) == (["system"], [threads])
