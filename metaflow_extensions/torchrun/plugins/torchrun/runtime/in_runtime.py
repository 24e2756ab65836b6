"""What Metaflow's runtime process (``flow.py run``) runs of ours, as it starts a local
control task: the control named in the task's environment, with the run's warm process.
Apart from local_nodes.py, which runs in the control task itself: the runtime loads
none of the gang's server or the nodes' supervision (about 40 of our modules a run).
"""

from __future__ import annotations

import os
from typing import Any, Optional

from ..gang.topology import CONTROL_TASK_ID_ENV
from .warm_start import share_runtime_warm

# The pid of the Metaflow runtime (`flow.py run`) that started a local control task.
RUNTIME_PID_ENV = "METAFLOW_TORCHRUN_RUNTIME_PID"


def name_local_control(env: Any, task_id: Any, warm: Optional[bool] = None) -> None:
    """In Metaflow's runtime, as it starts a local control task: the control's task id in
    its environment (Metaflow sets it only after @checkpoint read it: two lineages per gang
    otherwise), and with ``warm`` the runtime's warm process to fork from."""
    if isinstance(env, dict):
        env[CONTROL_TASK_ID_ENV] = str(task_id)
        env[RUNTIME_PID_ENV] = str(os.getpid())
        if warm is not None:
            share_runtime_warm(env, warm)
