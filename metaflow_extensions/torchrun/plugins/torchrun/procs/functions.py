"""Running a Python function on every rank, and carrying values back: the function
by reference (never its code), arguments and results by pickle.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import stat
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

from .records import PRIVATE_NEW
from .names import EXCEPTION_SUFFIX, RETURN_SUFFIX, STATUS_SUFFIX, rank_file, rank_of

# The name a flow file gets when a rank imports it (it is ``__main__`` in the task).
FLOW_MODULE_NAME = "__mf_torchrun_flow__"


class FunctionReferenceError(ValueError):
    """The callable cannot be found again by name in another process."""


@dataclass(frozen=True)
class FunctionRef:
    kind: str  # "module" (importable by name) or "path" (the flow file)
    target: str
    qualname: str

    def encode(self) -> str:
        return "%s:%s:%s" % (self.kind, self.qualname, self.target)

    @staticmethod
    def decode(text: str) -> "FunctionRef":
        kind, qualname, target = text.split(":", 2)
        return FunctionRef(kind, target, qualname)


def reference_to(fn: Callable) -> FunctionRef:
    qualname = getattr(fn, "__qualname__", None)
    module_name = getattr(fn, "__module__", None)
    if not qualname or not module_name or "<" in qualname:
        raise FunctionReferenceError(
            "%r is not a module-level function: ranks find the function by its "
            "module and name, so define it at the top level of the flow file or of "
            "an importable module (not a lambda, a nested function or a method)." % (fn,)
        )
    module = sys.modules.get(module_name)
    if module is None:
        raise FunctionReferenceError("the module %r of %r is not loaded." % (module_name, fn))
    if _resolve(module, qualname) is not fn:
        raise FunctionReferenceError("%s.%s does not name %r: ranks could not find it." % (module_name, qualname, fn))
    if module_name == "__main__":
        path = getattr(module, "__file__", None)
        if not path:
            raise FunctionReferenceError("%r is defined in an interactive session; define it in a file." % (fn,))
        return FunctionRef("path", os.path.abspath(path), qualname)
    return FunctionRef("module", module_name, qualname)


def _resolve(obj: Any, qualname: str) -> Any:
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def load(ref: FunctionRef) -> Callable:
    if ref.kind == "path":
        module = sys.modules.get(FLOW_MODULE_NAME)
        if module is None:
            sys.path.insert(0, os.path.dirname(ref.target))
            spec = importlib.util.spec_from_file_location(FLOW_MODULE_NAME, ref.target)
            if spec is None or spec.loader is None:
                raise FunctionReferenceError("cannot import the flow file %s" % ref.target)
            module = importlib.util.module_from_spec(spec)
            sys.modules[FLOW_MODULE_NAME] = module
            spec.loader.exec_module(module)
        # Arguments pickled in the task refer to the flow file as __main__.
        sys.modules["__main__"] = module
    else:
        module = importlib.import_module(ref.target)
    fn = _resolve(module, ref.qualname)
    if not callable(fn):
        raise FunctionReferenceError("%s has no function %s" % (ref.target, ref.qualname))
    return fn


def alias_flow_module() -> None:
    """Values pickled by ranks may name the flow file as they imported it."""
    main = sys.modules.get("__main__")
    if main is not None:
        sys.modules.setdefault(FLOW_MODULE_NAME, main)


def split_args(args: Any) -> Tuple[tuple, Dict[str, Any]]:
    """A dict is keyword arguments, a list or tuple positional ones."""
    if args is None:
        return (), {}
    if isinstance(args, dict):
        bad = [k for k in args if not isinstance(k, str)]
        if bad:
            raise TypeError("keyword argument names must be strings, not %r" % (bad,))
        return (), dict(args)
    if isinstance(args, (list, tuple)):
        return tuple(args), {}
    raise TypeError("entrypoint_args for a function must be a dict (keyword arguments) or a list "
                    "(positional arguments), not %s" % type(args).__name__)


def result_path(directory: str, rank: int) -> str:
    return rank_file(directory, rank, RETURN_SUFFIX)


def exception_path(directory: str, rank: int) -> str:
    return rank_file(directory, rank, EXCEPTION_SUFFIX)


def write_pickle(path: str, value: Any) -> None:
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, PRIVATE_NEW, 0o600)
    with os.fdopen(fd, "wb") as f:
        pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


def read_pickle(path: str) -> Any:
    data = read_own_bytes(path)
    if data is None:
        raise FileNotFoundError(path)
    return pickle.loads(data)


def read_returns(directory: str, ranks: Optional[Iterable[int]] = None) -> Dict[int, Any]:
    """Only the ranks that ran here (``ranks``, else those with a status file),
    and only files nobody else may write: nothing else is ever unpickled."""
    alias_flow_module()
    if ranks is None:
        ranks = [r for r in (rank_of(name, STATUS_SUFFIX) for name in os.listdir(directory)) if r is not None]
    found: Dict[int, Any] = {}
    for rank in sorted(set(ranks)):
        data = read_own_bytes(result_path(directory, rank))
        if data is not None:
            found[rank] = pickle.loads(data)
    return found


def read_own_bytes(path: str) -> Optional[bytes]:
    """None when absent; anything but a private regular file of ours is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise PermissionError("%s is not a private regular file of uid %d (uid %d, mode %o): not loaded"
                                  % (path, os.geteuid(), st.st_uid, stat.S_IMODE(st.st_mode)))
        return f.read()


def read_exception(directory: str, rank: int) -> Optional[BaseException]:
    path = exception_path(directory, rank)
    if not os.path.exists(path):
        return None
    alias_flow_module()
    try:
        exc = read_pickle(path)
    except Exception:
        return None
    return exc if isinstance(exc, BaseException) else None


def with_rank(exc: BaseException, rank: int) -> BaseException:
    prefix = "[rank %d] " % rank
    if exc.args and isinstance(exc.args[0], str):
        if not exc.args[0].startswith(prefix):
            exc.args = (prefix + exc.args[0],) + tuple(exc.args[1:])
    else:
        exc.args = (prefix.strip(),) + tuple(exc.args)
    return exc
