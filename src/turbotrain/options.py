"""Every module that registers config-group options, listed: importing this fills the registries.
The entry points import it first; a new option module is added here (a test checks the list)."""

from turbotrain.compression import compress, conv_lowrank, lowrank, prune
from turbotrain.core.registry import options_loaded
from turbotrain.data import arrow, folder, loader, tars, text, vision
from turbotrain.deploy import quantize
from turbotrain.models import fast_cnn
from turbotrain.models import text as text_models
from turbotrain.models import vision as vision_models
from turbotrain.models.attention import options as attention
from turbotrain.train import distributed, loggers, optim, precision, profiling, sched

MODULES = (
    compress,
    conv_lowrank,
    lowrank,
    prune,
    arrow,
    folder,
    tars,
    loader,
    text,
    vision,
    quantize,
    fast_cnn,
    text_models,
    vision_models,
    attention,
    distributed,
    optim,
    precision,
    profiling,
    sched,
    loggers,
)
options_loaded()
