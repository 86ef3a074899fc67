"""Train an image or text classifier: `python train.py [group=option ...] [key=value ...]`."""

import gc

# Importing torch, torchvision (torch._dynamo, sympy) and hydra makes ~570,000 objects that live as
# long as the process. Collecting while they are made, and again at exit, cost ~2 s of every run's
# wall time: no collections during the imports, and the imported objects frozen out of later ones
gc.disable()
# isort: split

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

import turbotrain.options  # noqa: F401  (fills the option registries)
from turbotrain.config import exit_on_help, exit_on_unknown_option, register_configs
from turbotrain.core.errors import USER_ERRORS, as_disk_full, as_out_of_memory, one_line, report
from turbotrain.train import sweep
from turbotrain.train.preemption import Preempted
from turbotrain.train.run import TrainingError, train
from turbotrain.train.run_dir import note_run_dir, run_dir_argv, save_hydra_files

register_configs()
gc.freeze()
gc.enable()


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float:
    import turbotrain.options  # noqa: F401, F811  again here: a launcher (submitit) may run this function in a process of its own

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    note_run_dir(run_dir)
    save_hydra_files(run_dir, cfg, HydraConfig.instance().cfg)
    try:
        return train(cfg, run_dir, overrides=list(hydra_cfg.overrides.task))
    except Preempted as e:
        report(e)
        sys.exit(128 + e.signum)
    except Exception as e:
        e = as_disk_full(as_out_of_memory(e))
        user_error = isinstance(e, (*USER_ERRORS, TrainingError, MemoryError))
        if hydra_cfg.mode == RunMode.MULTIRUN:  # one failed job must not end the sweep
            if not user_error:
                logging.getLogger("turbotrain").exception("job failed")
            report(e)
            sweep.record_failure(run_dir, one_line(e))
            if "optuna" in hydra_cfg.sweeper._target_:
                raise sweep.JobFailed(one_line(e)) from None  # Optuna records a raised trial as failed
            return float("nan")  # the basic sweeper would end the sweep on an exception
        if not user_error:
            raise
        report(e)
        sys.exit(2)


if __name__ == "__main__":
    exit_on_unknown_option(sys.argv[1:], Path(__file__).parent / "conf")
    exit_on_help(sys.argv[1:], Path(__file__), "train")
    sys.argv = run_dir_argv(sys.argv)
    main()
    sys.exit(1 if sweep.failed_jobs() else 0)
