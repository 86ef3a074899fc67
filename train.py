"""Train an image or text classifier: `python train.py [group=option ...] [key=value ...]`."""

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from turbotrain.config import register_configs
from turbotrain.distributed import publish_run_dir, torchrun_argv
from turbotrain.errors import USER_ERRORS, report

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float:
    from turbotrain.pipeline import train  # torch import after Hydra has parsed argv (fast --help)

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    publish_run_dir(run_dir)
    try:
        return train(cfg, run_dir, overrides=list(hydra_cfg.overrides.task))
    except USER_ERRORS as e:
        report(e)
        sys.exit(2)


if __name__ == "__main__":
    sys.argv = torchrun_argv(sys.argv)
    main()
