"""torch for a test file that uses it at its top level: imported at its first use in a test, so that
the suite's collection imports no torch (tests/unit/test_pools.py)."""


class _LazyTorch:
    def __getattr__(self, name):
        if name.startswith("_") or name == "pytestmark":  # what pytest's collection asks of every global
            raise AttributeError(name)
        import torch as real

        return getattr(real, name)


torch = _LazyTorch()
