"""Writes the NCCL dumps test_flight.py reads: no GPU here, so they are built
field by field as torch's writer lays them out (``FlightRecorder::dump_json``
in torch/include/torch/csrc/distributed/c10d/FlightRecorderDetail.hpp, the same
in 2.13.0, 2.14.1 and 2.15.0), with what stock ProcessGroupNCCL puts in them:
``profiling_name`` "nccl:<op>", an entry its watchdog saw finish "completed",
retired, with ``duration_ms``; ``pg_status`` counted in collective sequence
numbers; ``comm_lib_version`` NCCL's; ``nccl_comm_state`` per communicator.
``make gpu-check`` (benchmarks/gpu.py) captures real ones on a GPU node.

    python nccl_writer.py DIR

``hang``: the scenario of gloo-hang-rank*.json on NCCL: 3 all_reduces and a
barrier on the default group, one all_reduce on a second group, then rank 0
waits in an all_reduce rank 1 skipped. ``nccl2-hang-rank0.json``: the same
rank 0 as torch 2.15's per-backend hook records nccl2 (no duration).
"""

import json
import os
import sys

T0 = 1795609987042719832


def entry(record_id, pg_id, group, seq, op, done, backend="nccl", duration=True):
    e = {"record_id": record_id, "pg_id": pg_id, "process_group": list(group), "thread_name": "pt_main_thread",
         "thread_id": "140093977115520", "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
         "profiling_name": "%s:%s" % (backend, op), "time_created_ns": T0 + record_id * 1000000}
    if done and duration:
        e["duration_ms"] = 0.25
    e.update({"input_sizes": [[2]], "input_dtypes": ["Float"], "output_sizes": [[2]], "output_dtypes": ["Float"],
              "state": "completed" if done else "scheduled",
              "time_discovered_started_ns": 0,
              "time_discovered_completed_ns": T0 + record_id * 1000000 + 300000 if done else 0,
              "retired": done, "timeout_ms": 600000, "is_p2p": False})
    return e


def dump(rank, backend="nccl"):
    default, second = ("0", "default_pg"), ("1", "undefined")
    duration = backend == "nccl"
    entries = [entry(0, 0, default, 1, "all_reduce", True, backend, duration),
               entry(1, 0, default, 2, "all_reduce", True, backend, duration),
               entry(2, 0, default, 3, "all_reduce", True, backend, duration),
               entry(3, 1, second, 1, "all_reduce", True, backend, duration),
               entry(4, 0, default, 4, "barrier", True, backend, duration)]
    if rank == 0:
        entries.append(entry(5, 0, default, 5, "all_reduce", False, backend, duration))
    status = {"0": {"last_enqueued_collective": str(5 if rank == 0 else 4), "last_started_collective": "-1",
                    "last_completed_collective": "4"},
              "1": {"last_enqueued_collective": "1", "last_started_collective": "-1",
                    "last_completed_collective": "1"}}
    comms = {"0": {"nccl_comm_state": "running"}, "1": {"nccl_comm_state": "running"}} if backend == "nccl" else None
    out = {"version": "2.10", "comm_lib_version": "2.27.5" if backend == "nccl" else "",
           "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"},
                         "1": {"name": "1", "desc": "undefined", "ranks": "[0, 1]"}},
           "pg_status": status, "entries": entries}
    if comms is not None:
        out["nccl_comm_state"] = comms
    return out


if __name__ == "__main__":
    here = sys.argv[1]
    for rank in (0, 1):
        with open(os.path.join(here, "nccl-hang-rank%d.json" % rank), "w") as f:
            json.dump(dump(rank), f, sort_keys=True, separators=(",", ":"))
    with open(os.path.join(here, "nccl2-hang-rank0.json"), "w") as f:
        json.dump(dump(0, "nccl2"), f, sort_keys=True, separators=(",", ":"))
