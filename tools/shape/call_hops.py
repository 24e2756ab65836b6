"""How far one ``current.torch.run`` call travels before torchrun's agent
starts: a real 2-node local flow (``hops_flow.py``) traces the control's call
path, and this counts

- hops: the distinct calls from a function of one of the package's modules into
  a function of another (a loop over a directory's entries is one hop, however
  many entries the host has);
- calls: every such call as made (grows with what the host holds);
- modules: the distinct modules the call passed through;
- subpackage transitions: hops between two subpackages (or a subpackage and the
  package's top level);
- upward: hops from a lower layer back into a higher one (a callback).

    python tools/shape/call_hops.py [--json] [--list]

The numbers are in docs/design.md ("The shape, measured").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.sep + os.path.join("metaflow_extensions", "torchrun", "plugins", "torchrun") + os.sep


def module_of(path: str) -> str:
    """``runtime/call`` for a file of the package, "" for any other file."""
    if PACKAGE not in path:
        return ""
    rel = path.split(PACKAGE, 1)[1]
    return rel[:-3] if rel.endswith(".py") else rel


def subpackage_of(module: str) -> str:
    return module.split("/", 1)[0] if "/" in module else "."


# The layers, top first (pyproject.toml's import contract): a hop from a lower
# one into a higher one is a callback crossing the layers upward.
LAYERS = ["decorator cli", "handle lint compat spec", "runtime", "card", "record", "launch", "gang", "errors", "cause", "procs",
          "host", "base load_order"]


def layer_of(module: str) -> int:
    top = module.split("/", 1)[0]
    return next((i for i, names in enumerate(LAYERS) if top in names.split()), len(LAYERS))


def count(trace: List[List[str]]) -> Dict[str, object]:
    calls = 0
    hops: List[Tuple[str, str, str, str]] = []
    modules: List[str] = []
    for caller, caller_name, callee, name in trace:
        src, dst = module_of(caller), module_of(callee)
        if dst and dst not in modules:
            modules.append(dst)
        if src and dst and src != dst:
            calls += 1
            if (src, caller_name, dst, name) not in hops:
                hops.append((src, caller_name, dst, name))
    transitions = [h for h in hops if subpackage_of(h[0]) != subpackage_of(h[2])]
    upward = [h for h in hops if layer_of(h[2]) < layer_of(h[0])]
    return {"hops": len(hops), "calls": calls, "modules": len(modules),
            "subpackage_transitions": len(transitions), "upward": len(upward), "module_list": modules,
            "hop_list": ["%s.%s -> %s.%s" % h for h in hops]}


def trace_call() -> List[List[str]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "hops.json")
        env = dict(os.environ, HOPS_OUT=out, METAFLOW_DATASTORE_SYSROOT_LOCAL=tmp)
        env.setdefault("METAFLOW_USER", "shape")
        done = subprocess.run([sys.executable, "hops_flow.py", "--quiet", "run"], cwd=HERE, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            sys.exit("the traced flow failed:\n" + done.stdout[-4000:])
        with open(out) as f:
            return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--list", action="store_true", help="every hop, in order")
    args = parser.parse_args()
    counts = count(trace_call())
    if args.json:
        print(json.dumps(counts, indent=1))
        return
    print("hops %(hops)d, calls %(calls)d, modules %(modules)d, subpackage transitions "
          "%(subpackage_transitions)d, upward %(upward)d" % counts)
    if args.list:
        print("\n".join(counts["hop_list"]))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
