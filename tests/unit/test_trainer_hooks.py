"""The bootstrap's hook that makes HF's and Lightning's Trainer report progress
(procs/trainer_hooks.py): it imports neither library itself, adds its callback
once the script imports the trainer, and METAFLOW_TORCHRUN_TRAINER_PROGRESS=0,
as the step's start reads it, turns it off: the rank reads it in its entry file.
Real rank bootstraps and a real ``transformers``; whole runs that report:
tests/integration/test_trainer_progress.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.launch.command import BOOTSTRAP_MODULE
from metaflow_extensions.torchrun.plugins.torchrun.base.knobs import TRAINER_PROGRESS_ENV, read_knobs
from metaflow_extensions.torchrun.plugins.torchrun.procs import entry, names, trainer_hooks

NOTHING = """
import json, sys
print(json.dumps({"loaded": sorted(m for m in ("transformers", "lightning", "pytorch_lightning", "torch")
                                   if m in sys.modules),
                  "hooked": any(type(f).__name__ == "_AfterImport" for f in sys.meta_path)}))
"""
HF = """
import json
import transformers.trainer as t
print(json.dumps({"callbacks": [c.__name__ for c in t.DEFAULT_CALLBACKS]}))
"""


def _rank(tmp_path, code, setting=None):
    """A rank of a step whose METAFLOW_TORCHRUN_TRAINER_PROGRESS is ``setting``;
    the ranks' environment says on, so only the entry file can say off."""
    script = tmp_path / "script.py"
    script.write_text(code)
    knobs, refused = read_knobs({TRAINER_PROGRESS_ENV: setting} if setting is not None else {})
    assert not refused
    work = tmp_path / "work"
    work.mkdir()
    path = entry.write_entry(str(work), [str(script)], knobs.trainer_progress)
    environ = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")}
    environ.update({names.WORK_DIR_ENV: str(work), "RANK": "0", names.LABELS_ENV: "0", names.ENTRY_ENV: path,
                    TRAINER_PROGRESS_ENV: "1"})
    r = subprocess.run([sys.executable, "-m", BOOTSTRAP_MODULE, path], env=environ, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_hook_imports_neither_trainer_until_the_script_does(tmp_path):
    assert _rank(tmp_path, NOTHING) == {"loaded": [], "hooked": True}
    (tmp_path / "off").mkdir()
    assert _rank(tmp_path / "off", NOTHING, "0") == {"loaded": [], "hooked": False}


@pytest.mark.parametrize("setting, hooked", [(None, True), ("0", False)])
def test_hf_trainers_get_the_callback_unless_it_is_turned_off(tmp_path, setting, hooked):
    callbacks = _rank(tmp_path, HF, setting)["callbacks"]
    assert ("TorchrunProgress" in callbacks) is hooked, callbacks
    assert callbacks[0] == "DefaultFlowCallback"  # HF's own stay, first


def test_a_trainer_imported_before_the_hook_is_patched_at_once(monkeypatch):
    """Function entrypoints may import the trainer before the bootstrap's hook."""
    class Module:
        __name__ = trainer_hooks._HF
        DEFAULT_CALLBACKS: list = []

    seen = []
    monkeypatch.setitem(sys.modules, trainer_hooks._HF, Module)
    monkeypatch.setattr(trainer_hooks, "add_to_hf", lambda module: seen.append(module))
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if type(f).__name__ != "_AfterImport"])
    trainer_hooks.install()
    assert seen == [Module]
