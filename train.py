"""Train an image or text classifier: `python train.py [group=option ...] [key=value ...]`."""

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from turbotrain.config import register_configs
from turbotrain.distributed import publish_run_dir, torchrun_argv
from turbotrain.errors import OOM_HINT, USER_ERRORS, exit_on_unknown_option, report

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float:
    import torch  # after Hydra has parsed argv: --help stays fast

    from turbotrain.pipeline import TrainingError, train
    from turbotrain.preemption import Preempted

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    publish_run_dir(run_dir)
    try:
        return train(cfg, run_dir, overrides=list(hydra_cfg.overrides.task))
    except (*USER_ERRORS, TrainingError) as e:
        report(e)
        sys.exit(2)
    except Preempted as e:
        report(e)
        sys.exit(128 + e.signum)
    except torch.OutOfMemoryError as e:
        report(RuntimeError(f"{OOM_HINT} ({str(e).splitlines()[0]})"))
        sys.exit(2)


if __name__ == "__main__":
    exit_on_unknown_option(sys.argv[1:], Path(__file__).parent / "conf")
    sys.argv = torchrun_argv(sys.argv)
    main()
