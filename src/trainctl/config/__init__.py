"""Presets and job files: typed, validated configuration.

Read with :mod:`tomllib`; written with :mod:`tomlkit` so comments and order survive.
Every problem is a :class:`ConfigError` that names the file, the key and what is allowed::

    presets/A.toml: [dataloader] workers: must be an integer >= 0 (got -1)

The package, by concern (import from here; the modules are its inside):

- :mod:`.validation`: :class:`ConfigError` and the field checkers (``Problems``);
- :mod:`.preset`: the preset model (:class:`Preset`, ``child_env``, ``args``);
- :mod:`.store`: where presets are found, loaded, edited and saved;
- :mod:`.kinds`: the job-file tables of each runner kind (:data:`JOB_TABLES`);
- :mod:`.job`: job files (:class:`Job`, :func:`load_job`).
"""

from __future__ import annotations

from trainctl.config.job import (
    ALERT_KINDS,
    JOB_FILE_NAME,
    JOB_KINDS,
    Job,
    expand_resume_args,
    job_problems,
    load_job,
    parse_deadline,
)
from trainctl.config.kinds import JOB_TABLES, JobTable, torchrun_command
from trainctl.config.preset import (
    MP_CONTEXTS,
    SHARING_STRATEGIES,
    DataLoaderCfg,
    Preset,
    ThreadsCfg,
    preset_from_text,
    preset_problems,
)
from trainctl.config.store import (
    diff_text,
    is_shipped,
    list_presets,
    load_preset,
    new_preset_from,
    preset_search_dirs,
    save_preset_text,
    update_preset_text,
    update_preset_values,
    user_config_dir,
)
from trainctl.config.validation import ConfigError

__all__ = [
    "ConfigError",
    "DataLoaderCfg",
    "ThreadsCfg",
    "Preset",
    "Job",
    "preset_problems",
    "preset_from_text",
    "load_preset",
    "list_presets",
    "preset_search_dirs",
    "is_shipped",
    "user_config_dir",
    "save_preset_text",
    "update_preset_text",
    "update_preset_values",
    "diff_text",
    "new_preset_from",
    "load_job",
    "job_problems",
    "parse_deadline",
    "expand_resume_args",
    "MP_CONTEXTS",
    "SHARING_STRATEGIES",
    "ALERT_KINDS",
    "JOB_KINDS",
    "JOB_FILE_NAME",
    "JOB_TABLES",
    "JobTable",
    "torchrun_command",
]
