"""Every rank, while the call runs (every rank and agent started, the warm
process serving): what under this user's base directory is open to others,
and this rank's own umask."""

import os
import stat

import torch.distributed as dist

from _common import init, rank, write_json

init()
dist.barrier()  # every rank is up: its agent's and its own files exist
base = os.environ["METAFLOW_TORCHRUN_WORK_DIR"]
while os.path.basename(base) != "metaflow-torchrun-%d" % os.geteuid() and base != os.path.dirname(base):
    base = os.path.dirname(base)
loose, seen = {}, 0
for top, dirs, files in os.walk(base):
    for name in dirs + files:
        path = os.path.join(top, name)
        try:
            mode = stat.S_IMODE(os.lstat(path).st_mode)
        except FileNotFoundError:
            continue
        seen += 1
        if mode & 0o077:
            loose[os.path.relpath(path, base)] = oct(mode)
umask = os.umask(0o022)
os.umask(umask)
write_json("modes-%d.json" % rank(), {"base": base, "seen": seen, "loose": loose, "umask": umask})
dist.barrier()
dist.destroy_process_group()
