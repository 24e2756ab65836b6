"""Helpers for the test scripts: where to write reports, and a gloo group."""

import json
import os
import subprocess

# A shell, not a thread: a thread needs the GIL, and a rank loading torch's
# libraries on a loaded machine can hold it past hang_timeout; the shell ends
# with its rank.
_CHATTER = 'while kill -0 %d 2>/dev/null; do echo starting...; sleep 1; done'


def out_dir() -> str:
    path = os.environ["MFTR_TEST_OUT"]
    os.makedirs(path, exist_ok=True)
    return path


def rank() -> int:
    return int(os.environ["RANK"])


def write_json(name: str, data) -> None:
    path = os.path.join(out_dir(), name)
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


def init() -> None:
    # torch is imported here, not at the top: the scripts that only print or
    # echo their arguments spare each rank its `import torch` (about 3 CPU-s).
    import torch.distributed as dist

    dist.init_process_group("gloo")



def talk_while_starting() -> subprocess.Popen:
    """Every second a line until ``.kill()``: imports and the rendezvous are
    slow on a small machine, and silence is what hang_timeout measures."""
    return subprocess.Popen(["/bin/sh", "-c", _CHATTER % os.getpid()])


def done_starting(chatter: subprocess.Popen) -> None:
    chatter.kill()
    chatter.wait()
