"""Export a trained run: `python export.py deploy=int8 [run=<run dir>]` (default: the newest run)."""

import gc

# Importing torch, torchvision (torch._dynamo, sympy) and hydra makes ~570,000 objects that live as
# long as the process. Collecting while they are made, and again at exit, cost ~2 s of every run's
# wall time: no collections during the imports, and the imported objects frozen out of later ones
gc.disable()
# isort: split

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

import turbotrain.options  # noqa: F401  (fills the option registries)
from turbotrain.config import exit_on_help, exit_on_unknown_option, register_configs
from turbotrain.core.errors import USER_ERRORS, as_disk_full, report
from turbotrain.deploy.export import export

register_configs()
gc.freeze()
gc.enable()


@hydra.main(version_base="1.3", config_path="conf", config_name="export")
def main(cfg: DictConfig) -> None:
    import turbotrain.options  # noqa: F401, F811  again here: a launcher may run this function in a process of its own

    try:
        export(cfg)
    except Exception as e:
        e = as_disk_full(e)
        if not isinstance(e, USER_ERRORS):
            raise
        report(e)
        sys.exit(2)


if __name__ == "__main__":
    exit_on_unknown_option(sys.argv[1:], Path(__file__).parent / "conf")
    exit_on_help(sys.argv[1:], Path(__file__), "export")
    main()
