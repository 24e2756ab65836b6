"""A fuzzer over current.torch.run's inputs (issue 38).

Every input to the planning path (``launch/plan.plan_call``: the entrypoint,
``entrypoint_args``, ``nproc_per_node``, ``torchrun_args``, and the step's own
``torchrun_args``) is either refused with ``TorchrunInvalidArgument`` (never a
``ValueError``, ``OSError``, ``UnicodeError`` or ``TypeError`` from inside) or
accepted; an accepted call's script arguments come out of the entry file the
ranks read exactly as given, and torch's own parser takes the torchrun command
built from its options. ``plan_call`` starts nothing: a refusal is always
before any agent.

Bounded in CI: ``FUZZ_EXAMPLES`` examples (default 300) from seed
``FUZZ_SEED`` (default 38). A deeper search: ``TORCHRUN_FUZZ_EXAMPLES=20000
python -m pytest tests/unit/test_fuzz_inputs.py`` (docs/development.md).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile

import metaflow  # noqa: F401  (must come before our modules)
import pytest

from metaflow_extensions.torchrun.plugins.torchrun.errors import TorchrunInvalidArgument
from metaflow_extensions.torchrun.plugins.torchrun.launch.command import Launch, build_command
from metaflow_extensions.torchrun.plugins.torchrun.launch.plan import StepDefaults, plan_call
from metaflow_extensions.torchrun.plugins.torchrun.procs import entry, names

hypothesis = pytest.importorskip("hypothesis")


def _run():
    """torchrun's own module, imported by the first test that reads it, not as the file is
    collected (tools/pools.py: a collection without torch, which compiles apart)."""
    return pytest.importorskip("torch.distributed.run")
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ_EXAMPLES = int(os.environ.get("TORCHRUN_FUZZ_EXAMPLES", "300"))
FUZZ_SEED = int(os.environ.get("TORCHRUN_FUZZ_SEED", "38"))

# Where the one real script is; the strategies name it, so it is made at import.
SCRIPT_DIR = pathlib.Path(tempfile.mkdtemp(prefix="torchrun-fuzz-"))
SCRIPT = "train.py"


def entry_function(*args, **kwargs):
    """A module-level function: an entrypoint the ranks can import."""


# What a careless or hostile user types: option-like, shell-like, empty,
# control characters, NUL, surrogates (lone and surrogate-escaped), huge.
SPECIAL = st.sampled_from([
    "", " ", "-", "--", "---", "-1", "--max-restarts", "--max_restarts=2", "-m", "--module", "--standalone",
    "--nnodes=3", "--rdzv-conf", "max_restarts", "nproc_per_node", "True", "None", "true", "$(id)", "`id`",
    "a b", "\n", "\t", "\x1b[31m", "\0", "a\0b", "\udcff", "\ud800", "\u2028", "١",
    "--log", "--master", "train.py", "auto", "gpu", "0", "2", "1e400", "nan", "inf",
])
HUGE = st.builds(lambda n: "x" * n, st.just(200_000))  # built: hypothesis shows its strategy
TEXT = st.one_of(SPECIAL, HUGE, st.text(st.characters(exclude_categories=()), max_size=12))
SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(), st.builds(pow, st.just(10), st.just(5000)), st.floats(), TEXT, st.binary(max_size=8),
    st.builds(pathlib.PurePosixPath, st.text(max_size=5)),
)
VALUE = st.recursive(
    SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=3), st.tuples(inner),
                                    st.dictionaries(TEXT, inner, max_size=3), st.sets(st.integers(), max_size=2)),
    max_leaves=6,
)
OPTION_KEY = st.one_of(st.sampled_from([
    "max_restarts", "max-restarts", "--max-restarts", "monitor_interval", "role", "tee", "-t", "redirects",
    "rdzv_conf", "start_method", "log_dir", "virtual_local_rank", "nproc_per_node", "local_ranks_filter",
    "nnodes", "master_port", "standalone", "module", "max_restart", "max", "log", "signals_to_handle",
]), TEXT, st.integers(), st.none())
ARGS = st.one_of(
    st.none(), VALUE, st.lists(VALUE, max_size=4), st.dictionaries(TEXT, VALUE, max_size=4),
)
TORCHRUN_ARGS = st.one_of(
    st.none(), VALUE, st.dictionaries(OPTION_KEY, VALUE, max_size=3),
    st.lists(st.one_of(OPTION_KEY, VALUE), max_size=5),
)
ENTRYPOINT = st.one_of(
    st.just(SCRIPT), st.just(str(SCRIPT_DIR / SCRIPT)), st.just(entry_function), st.just(lambda: None),
    st.just(SCRIPT_DIR), st.just(pathlib.Path(SCRIPT)), st.builds(lambda t: t + ".py", TEXT), SCALAR,
    st.just("train\0.py"), st.just("\ud800.py"),
)
NPROC = st.one_of(st.none(), SCALAR, st.sampled_from(["1", " 2 ", "auto", "١", 0, -1, 1025, 2.0]))


@pytest.fixture(scope="module", autouse=True)
def scripts():
    # Made here, not only at import: a worker that runs this file's tests in two stretches sets the
    # fixture up again after its first teardown removed the folder.
    SCRIPT_DIR.mkdir(parents=True, exist_ok=True)
    (SCRIPT_DIR / SCRIPT).write_text("import sys\nprint(sys.argv)\n")
    yield
    shutil.rmtree(SCRIPT_DIR, ignore_errors=True)


def expected_item(value):
    return os.fsdecode(value) if isinstance(value, os.PathLike) else str(value)


def expected_argv(args):
    """The argv a script gets, from the documented rules (README): a list as
    given; a dict ``{"k": v}`` as ``--k v``, True (and 0.2's None) a bare
    ``--k``, False left out, a list ``--k a b``."""
    if args is None:
        return []
    if isinstance(args, (list, tuple)):
        return [expected_item(v) for v in args]
    out = []
    for key, value in args.items():
        flag = "--" + key.lstrip("-")
        if value is None or value is True:
            out.append(flag)
        elif value is not False:
            out.append(flag)
            out.extend(expected_item(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
    return out


def check_accepted(plan, entrypoint, entrypoint_args, tmp):
    if plan.function is not None:
        assert plan.entry_argv == [] and plan.function_args is entrypoint_args
    else:
        assert plan.script == str(SCRIPT_DIR / SCRIPT)
        assert plan.entry_argv == expected_argv(entrypoint_args)
        # What the ranks read: the entry file, as the bootstrap reads it.
        work = tmp / os.urandom(4).hex()
        work.mkdir()
        path = entry.write_entry(str(work), [plan.script] + plan.entry_argv)
        assert entry.bootstrap_entry([path], {names.ENTRY_ENV: path}).argv == [plan.script] + plan.entry_argv
    # torch's own parser takes the command, and reads max_restarts as we do.
    launch = Launch(python="py", num_nodes=2, node_index=1, nproc_per_node=plan.nproc, rdzv_host="10.0.0.1",
                    rdzv_port=29500, rdzv_id="x", entrypoint="/e.json", user_options=plan.options,
                    local_addr="10.0.0.2")
    parsed = _run().get_args_parser().parse_args(build_command(launch)[3:])
    restarts = plan.options.get("max-restarts", 0)
    assert isinstance(restarts, int)
    assert parsed.max_restarts == (restarts if restarts is not False else 0)


@seed(FUZZ_SEED)
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
                                 HealthCheck.function_scoped_fixture])
@given(entrypoint=ENTRYPOINT, entrypoint_args=ARGS, nproc=NPROC, torchrun_args=TORCHRUN_ARGS,
       step_args=st.one_of(st.none(), TORCHRUN_ARGS))
def test_every_input_is_refused_by_us_or_reaches_the_ranks_as_given(
        entrypoint, entrypoint_args, nproc, torchrun_args, step_args, tmp_path):
    defaults = StepDefaults(torchrun_args=step_args)
    try:
        plan = plan_call(entrypoint, entrypoint_args, nproc, torchrun_args, defaults, [str(SCRIPT_DIR)])
    except TorchrunInvalidArgument as e:
        assert e.message.strip()
        return
    check_accepted(plan, entrypoint, entrypoint_args, tmp_path)


class BytesPath:
    def __fspath__(self):
        return b"train.py"


class BrokenPath:
    def __fspath__(self):
        raise RuntimeError("no path today")


@pytest.mark.parametrize("entrypoint, says", [
    ("train\0.py", "entrypoint 'train\\x00.py' contains a NUL character, which no file path can hold."),
    ("\0", "contains a NUL character"),
    ("\ud800.py", "entrypoint '\\ud800.py' cannot be a file path on this system: surrogates not allowed."),
    (BytesPath(), "entrypoint must be the path of a Python script, not <"),
    (BrokenPath(), "os.fspath() failed: RuntimeError: no path today."),
])
def test_an_entrypoint_no_system_call_takes_is_refused_by_us(entrypoint, says):
    """Found by the fuzzer (NUL: ValueError from os.stat) or beside it (a lone
    surrogate: UnicodeEncodeError; a path-like giving bytes: TypeError)."""
    with pytest.raises(TorchrunInvalidArgument) as info:
        plan_call(entrypoint, None, None, None, StepDefaults(), [str(SCRIPT_DIR)])
    assert says in info.value.message
