"""The surviving mutants of `python -m bench mutation` judged equivalent: each changes no behaviour
a user could see, for the reason given (reviewed by hand, from its diff: `mutmut show NAME` in the
job's work tree). A mutant listed here that a test kills counts as killed; the list is read by
name, so a change to its function (which renumbers its mutants) calls for a second look."""

# mutant name -> why no behaviour a user could see changes
EQUIVALENT: dict[str, str] = {
    "turbotrain.deploy.quantize.x_quantize_for__mutmut_4": "example=None: FX's prepare traces the model"
    " symbolically and never runs the example input, so the artifact is the same",
    "turbotrain.train.loop.xǁStepǁ_note_for_stop__mutmut_22": "stop_count -= bad: the count is only read as"
    " zero or not (summed over ranks, all of one sign), and a first bad step still sets it non-zero",
    "turbotrain.train.loop.xǁTrainStateǁfrom_dict__mutmut_4": "another name than 'skips' left out of the fields a"
    " checkpoint may set: no checkpoint holds 'skips' (as_dict leaves it out), so nothing else is dropped",
    "turbotrain.train.loop.xǁTrainStateǁfrom_dict__mutmut_5": "'SKIPS': as mutant 4",
    "turbotrain.train.resume.x__schema_default__mutmut_3": "rpartition: no config key has two dots (groups"
    " hold no nested mappings), so both split a key at its one dot",
    "turbotrain.train.resume.x__schema_default__mutmut_10": "the None check dropped: OmegaConf.structured(None)"
    " is None, whose select gives the default (_ABSENT) as the check did",
    "turbotrain.train.resume.x__schema_default__mutmut_15": "default=None: the key is then set to None in the"
    " saved values, which read None (old.get) when it is left out",
    "turbotrain.train.resume.x__schema_default__mutmut_18": "no default (None): as mutant 15",
    "turbotrain.train.resume.x__numeric__mutmut_3": "rpartition: as _schema_default's mutant 3",
    "turbotrain.train.resume.x__numeric__mutmut_15": "rest.split(None): a field name holds no space and, with no"
    " two-dot key, no dot, so both give the whole name",
    "turbotrain.train.resume.x__numeric__mutmut_16": "rest.split('XX.XX'): as mutant 15",
    "turbotrain.train.resume.x_check_config__mutmut_3": "copy.copy for deepcopy: OmegaConf's shallow copy of a"
    " DictConfig copies its nodes too, so the choices applied to the copy leave the caller's config as typed",
    "turbotrain.train.resume.x_continue_schedule__mutmut_12": "every warning ignored around the one scheduler"
    " step, not only UserWarning: that step raises only the 'step() before optimizer.step()' UserWarning",
    "turbotrain.train.summary.x_startup_phases__mutmut_16": "zip(strict=None): falsy, zip's default, as strict=False"
    " (the list of earlier ages is one longer by design)",
    "turbotrain.train.summary.x_startup_phases__mutmut_20": "strict left out: as mutant 16",
    "turbotrain.core.checkpoint.x_restore__mutmut_12": "zip(strict=None): the kernels are read off the same"
    " optimizer's groups, and load_state_dict refuses another group count, so the lengths always agree",
    "turbotrain.core.checkpoint.x_restore__mutmut_15": "strict left out: as mutant 12",
    "turbotrain.core.checkpoint.x_restore__mutmut_16": "strict=False: as mutant 12",
    "turbotrain.train.resume.x_changed_keys__mutmut_4": "resolve=None for False on the saved config: as falsy, the"
    " same; and the saved yaml is written resolved (session.py), so it holds no interpolation either way",
    "turbotrain.train.resume.x_changed_keys__mutmut_6": "resolve left out on the saved config: False is its default",
    "turbotrain.train.resume.x_changed_keys__mutmut_8": "resolve=True on the saved config: it holds no"
    " interpolation (written resolved), so resolving changes nothing",
    "turbotrain.train.resume.x_changed_keys__mutmut_29": "keys of both sides (&) for either side (|): the new"
    " config holds every field of the schemas it selects and the saved one gains the defaults of those it lacks,"
    " so a key on one side only is one no schema of the new config has, which _numeric counts as no change",
    "turbotrain.train.optim.x_param_groups__mutmut_9": "named_parameters(recurse=None): falsy, as False, so"
    " each module still lists only its own parameters",
    "turbotrain.train.optim.x__sgd__mutmut_12": "no lr for the optimizer's default: every group param_groups"
    " builds carries its own lr, which torch takes over the default (the kernel timing's lr moves no weight a"
    " run keeps)",
    "turbotrain.data.loader.x_set_epoch_seed__mutmut_9": "epoch - 1 for epoch + 1: another stream per epoch,"
    " as distinct across run seeds, epochs and ranks (what a user can see; tests/test_alternating checks it)",
    "turbotrain.data.loader.x_set_epoch_seed__mutmut_10": "epoch + 2: as mutant 9",
    "turbotrain.train.loop.xǁTrainStateǁread_skips__mutmut_7": "skips=None after a read for [0, streak, streak]:"
    " the next count_skip starts from [0, nan_streak, nan_streak], nan_streak just set to that streak, on the"
    " flag's device, and a read before it returns nan_streak, the same streak",
    "turbotrain.train.loop.x_step_unless__mutmut_3": "getattr default None for False: as falsy, an optimizer"
    " without the attribute reads the flag either way",
    "turbotrain.train.loop.x__optimizer_step__mutmut_19": "under grad_clip, the gradients' norm alone for the losses'"
    " flag or'ed with it: a non-finite loss (any rank's, agreed) gives non-finite gradients, so the norm flags"
    " every step the losses did",
    "turbotrain.train.loop.x_short_run__mutmut_10": "enabled=None for False: as falsy, the tracker is off and"
    " writes nothing (a test checks that nothing is written)",
    "turbotrain.train.loop.x_short_run__mutmut_11": "logger_cfg=None: a tracker that is off never reads it",
    "turbotrain.train.loop.x_short_run__mutmut_12": "config=None: a tracker that is off never reads it",
    "turbotrain.train.loop.x_short_run__mutmut_17": "run dir 'XX.XX' for '.': a tracker that is off writes nowhere",
    "turbotrain.data.arrow.xǁArrowSourceǁ__init____mutmut_10": "fill_null(-2): a null label is left out as any negative label is",
    "turbotrain.data.arrow.xǁArrowSourceǁ__init____mutmut_40": "top -2 for a split without labels:"
    " range(-1) is as empty as range(0)",
    "turbotrain.data.tars.x__index__mutmut_49": "dtype=None: numpy makes int64 of Python ints on the"
    " 64-bit Linux and macOS builds torch ships for; an empty split's float64 arrays are never indexed",
    "turbotrain.data.tars.x__index__mutmut_51": "no dtype: as mutant 49",
    "turbotrain.data.tars.x__check_plain__mutmut_8": "read(None): the magic numbers are found at the start"
    " of the whole file as of its first 6 bytes",
    "turbotrain.data.tars.x__check_plain__mutmut_9": "read(7): as mutant 8",
    "turbotrain.data.tars.x_index_shard__mutmut_21": "mode r (any compression) for r: (plain): the"
    " compressions tarfile opens (gzip, bzip2, xz) are refused before it by their magic numbers",
    "turbotrain.data.tars.x_index_shard__mutmut_81": "zip(strict=None) over the records: each record is one"
    " (key, offset, size, label) tuple, so the four columns are of one length by construction",
    "turbotrain.data.tars.x_index_shard__mutmut_83": "zip without strict: as mutant 81",
    "turbotrain.data.tars.x_index_shard__mutmut_84": "zip(strict=False): as mutant 81",
    "turbotrain.data.tars.x__label__mutmut_20": "`bool and not int|str` for `bool or not int|str`: a JSON value"
    " that is neither int nor str (bool, float, null, list, object) never prints as digits alone, so the"
    " digit test refuses what the type tests did",
    "turbotrain.data.listing.x_scan__mutmut_36": "the key 'version' renamed in the saved listing's meta: nothing"
    " reads it there (load_listing finds the version in the file's name, -v<VERSION>.npz)",
    "turbotrain.data.listing.x_scan__mutmut_37": "'VERSION' for 'version': as mutant 36",
    "turbotrain.data.listing.x_scan__mutmut_64": "labels dtype=None: numpy makes int64 of Python ints on the 64-bit"
    " builds torch ships for; an empty split's float64 array is never indexed (an empty split is refused)",
    "turbotrain.data.listing.x_scan__mutmut_66": "no dtype: as mutant 64",
    "turbotrain.data.listing.x_scan__mutmut_72": "sizes dtype=None: as mutant 64 (an empty array hashes to the"
    " same no bytes in the fingerprint, whatever its dtype)",
    "turbotrain.data.listing.x_scan__mutmut_74": "no dtype: as mutant 72",
    "turbotrain.data.listing.x_scan__mutmut_80": "mtimes dtype=None: as mutant 72",
    "turbotrain.data.listing.x_scan__mutmut_82": "no dtype: as mutant 72",
    "turbotrain.data.listing.x_scan__mutmut_92": "dir_mtimes dtype=None: as mutant 64 (never empty: the root's is first)",
    "turbotrain.data.listing.x_scan__mutmut_94": "no dtype: as mutant 92",
    "turbotrain.data.listing.x_scan__mutmut_113": "17 hex digits of the fingerprint for 16: a longer name of the"
    " same arrays (the decoded cache's folder name), as distinct between listings",
    "turbotrain.data.listing.x_load_listing__mutmut_6": "17 hex digits of the root's digest in the saved"
    " listing's file name for 16: a longer name, as distinct between roots",
    "turbotrain.data.tars.x__classes__mutmut_11": "default=-2 for shards without a sample: range(-1) is as empty as range(0)",
    "turbotrain.data.tars.xǁShardSourceǁ__init____mutmut_31": "None for '' as the digest of a class the split"
    " has no sample of: a resume compares it only with the same default, read back the same way",
    "turbotrain.data.tars.xǁShardSourceǁ__init____mutmut_33": "no default (None): as mutant 31",
    "turbotrain.data.tars.xǁShardSourceǁ__init____mutmut_35": "'XXXX' for '': as mutant 31",
    "turbotrain.data.tars.x_load_index__mutmut_3": "the shards' stats joined by 'XX\\nXX': the digest is an opaque"
    " name of the same stats (its index file, its decoded cache), as distinct between shard sets as before",
    "turbotrain.data.tars.x_load_index__mutmut_6": "17 hex digits of the digest for 16: as mutant 3, a longer"
    " name of the same stats",
    "turbotrain.core.checkpoint.x_set_rng_state__mutmut_10": "astype(None) for astype(uint32) on numpy's"
    " saved keys: float64 holds every uint32 exactly and set_state casts them back (the same draws after,"
    " checked on numpy's MT19937)",
    "turbotrain.core.checkpoint.x_rng_state__mutmut_11": "astype(None) for astype(int64) on the keys saved:"
    " float64 holds every uint32 exactly, and set_rng_state casts them to uint32 (as its mutant 10)",
    "turbotrain.data.loader.xǁSeededBatchesǁ__getitems____mutmut_11": "% 2**64 for % 2**63: torch's generator"
    " takes any seed below 2**64, so each batch's seed stays valid and as distinct (tests/test_batch_seeds.py)",
    "turbotrain.data.loader.xǁEpochSamplerǁ__init____mutmut_5": "batch_size=2 by default: only a shuffled"
    " sampler with lengths reads it, and every such caller (the training loader) gives its batch size",
}
