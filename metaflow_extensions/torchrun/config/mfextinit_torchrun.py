"""@torchrun's knobs in Metaflow's configuration (docs/configuration.md), read as Metaflow reads its own:
the environment, then the Metaflow profile. Strings here: ``spec.read_settings`` parses them, so a bad
value is named by @torchrun rather than breaking ``import metaflow``.
"""

from metaflow.metaflow_config_funcs import from_conf

TORCHRUN_PORT = from_conf("TORCHRUN_PORT")
TORCHRUN_SECRET = from_conf("TORCHRUN_SECRET")
TORCHRUN_PROGRESS_SECONDS = from_conf("TORCHRUN_PROGRESS_SECONDS")
TORCHRUN_STRAGGLER_RATIO = from_conf("TORCHRUN_STRAGGLER_RATIO")
TORCHRUN_STRAGGLER_SECONDS = from_conf("TORCHRUN_STRAGGLER_SECONDS")
TORCHRUN_KEEP_LOGS_HOURS = from_conf("TORCHRUN_KEEP_LOGS_HOURS")
TORCHRUN_KEEP_LOGS = from_conf("TORCHRUN_KEEP_LOGS")
TORCHRUN_MAX_LOG_MB = from_conf("TORCHRUN_MAX_LOG_MB")
TORCHRUN_DEBUG = from_conf("TORCHRUN_DEBUG")
TORCHRUN_NODE_HISTORY = from_conf("TORCHRUN_NODE_HISTORY")
TORCHRUN_NODE_HISTORY_RUNS = from_conf("TORCHRUN_NODE_HISTORY_RUNS")
TORCHRUN_FLIGHT_RECORDER = from_conf("TORCHRUN_FLIGHT_RECORDER")
TORCHRUN_WARM_START = from_conf("TORCHRUN_WARM_START")
TORCHRUN_TRAINER_PROGRESS = from_conf("TORCHRUN_TRAINER_PROGRESS")
TORCHRUN_ARRIVALS = from_conf("TORCHRUN_ARRIVALS")
