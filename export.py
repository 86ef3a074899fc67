"""Export a trained run: `python export.py deploy=int8 [run=<run dir>]` (default: the newest run)."""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from turbotrain.config import register_configs
from turbotrain.errors import USER_ERRORS, exit_on_unknown_option, report

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="export")
def main(cfg: DictConfig) -> None:
    from turbotrain.deploy.export import export  # torch import after Hydra has parsed argv

    try:
        export(cfg)
    except USER_ERRORS as e:
        report(e)
        sys.exit(2)


if __name__ == "__main__":
    exit_on_unknown_option(sys.argv[1:], Path(__file__).parent / "conf")
    main()
