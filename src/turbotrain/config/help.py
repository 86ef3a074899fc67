"""`--help` without Hydra's `get_help`, which formats both of its config-group listings whatever
the help template uses: a config repository per group, each a deep copy of the ConfigStore that
holds every option's schema (most of a 10 s `--help` here). The text is Hydra's: its template,
its substitution, the config it would print. Hydra still answers a template that uses a listing
or the flags' help, a command line with other flags than --help and --resolve, and one whose
config does not compose (its error messages are its own)."""

from __future__ import annotations

import copy
import string
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

HELP_FLAGS = {"--help", "-h"}
HYDRA_ONLY = ("FLAGS_HELP", "HYDRA_CONFIG_GROUPS", "APP_CONFIG_GROUPS")  # template variables Hydra computes


def help_text(argv: list[str], conf_dir: Path, config_name: str, job_name: str) -> str | None:
    """What `--help` prints for the command line `argv`; None when Hydra has to answer it."""
    flags = {arg for arg in argv if arg.startswith("-")}
    if not flags & HELP_FLAGS or flags - HELP_FLAGS - {"--resolve"}:
        return None
    overrides = [arg for arg in argv if not arg.startswith("-")]
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3", job_name=job_name):
            cfg = compose(config_name, overrides, return_hydra_config=True)
    except Exception:
        return None
    template = cfg.hydra.help.template
    if any(name in template for name in HYDRA_ONLY):
        return None
    HydraConfig.instance().set_config(cfg)  # as Hydra does: ${hydra:...} in the config resolves
    job = copy.deepcopy(cfg)
    with open_dict(job):
        del job["hydra"]
    return string.Template(template).substitute(CONFIG=OmegaConf.to_yaml(job, resolve="--resolve" in flags))


def exit_on_help(argv: list[str], script: Path, config_name: str) -> None:
    """Before Hydra starts: answer `--help` for the entry point `script` (its conf/ beside it) and
    end the process, unless Hydra has to answer it."""
    text = help_text(argv, script.parent / "conf", config_name, job_name=script.stem)
    if text is not None:
        print(text)
        sys.exit(0)
