"""A script written for metaflow-torchrun 0.2: --bf16 takes a value ("true")."""

import argparse

from _common import rank, write_json

p = argparse.ArgumentParser()
p.add_argument("--bf16", type=lambda text: text == "true", default=False)
args = p.parse_args()
write_json("bool-%d.json" % rank(), {"bf16": args.bf16})
