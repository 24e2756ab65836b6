"""Names exported into ``metaflow``'s namespace. Metaflow copies every global of this
module that is not a module or a dunder name: keep it to the exported names."""

import os as _os
import sys as _sys

from . import conflicts as _conflicts

# An installed metaflow-torchrun 0.2 hides our plugins: named before anything of ours is imported.
_found = _conflicts.find_02_installs(_sys.path)
if _found:
    _here = _os.path.dirname(_os.path.dirname(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))))
    raise _conflicts.OldPackageInstalled(_conflicts.conflict_message(_found, _here))
# A module left here, Metaflow would alias it (``metaflow._conflicts``) with an import hook of its own.
del _found, _conflicts

from metaflow_extensions.torchrun.plugins.torchrun.errors import (  # noqa: F401, E402  (exported, after the check)
    GangAborted,
    TorchrunCallRefused,
    TorchrunException,
    TorchrunFailed,
    TorchrunInterrupted,
    TorchrunInvalidArgument,
    TorchrunMissingDependency,
    TorchrunNotRetried,
)
from metaflow_extensions.torchrun.plugins.torchrun.record.result import TorchrunResult  # noqa: F401, E402
# current.torch's type, for Metaflow's generated stubs and IDEs.
from metaflow_extensions.torchrun.plugins.torchrun.handle import TorchrunHandle  # noqa: F401, E402
from metaflow_extensions.torchrun.plugins.torchrun.compat import TorchrunSingleNodeMultiGPU  # noqa: F401, E402

# Metaflow's banner names the extension by these two (dunders: not copied into its namespace).
from metaflow_extensions.torchrun.plugins.torchrun.base.version import __version__  # noqa: F401, E402

__mf_extensions__ = "torchrun"
