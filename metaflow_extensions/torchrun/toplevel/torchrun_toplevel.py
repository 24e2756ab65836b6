"""Names exported into ``metaflow``'s namespace. Metaflow copies every global of this
module that is not a module or a dunder name: keep it to the exported names."""

# Metaflow reads this from every top-level extension module (before 2.16 it must exist).
__version__ = None


class TorchrunSingleNodeMultiGPU:
    """metaflow-torchrun 0.2's single-node launcher, not provided here: constructing
    it raises, naming the replacement (a @torchrun step with num_parallel=1)."""

    def __init__(self, *args, **kwargs):
        from metaflow_extensions.torchrun.plugins.torchrun.compat import (
            TorchrunSingleNodeMultiGPU as Moved,
        )

        Moved(*args, **kwargs)
