#!/usr/bin/env python3
"""PyTorch side of bench/startup: wall time for N ranks started with torch.multiprocessing.spawn
to init_process_group("gloo") through a file:// store in a fresh temp folder and finish their
first all_reduce. Measured in the parent, from just before spawn to the moment the last rank
finished its all_reduce (CLOCK_MONOTONIC is shared by every process of the host). Prints a
table and a JSON line {"bench":"startup_torch",...}.

Run with Debian's interpreter, which has torch: /usr/bin/python3 bench/startup_torch.py --nproc 4
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, world_size, run_dir):
    dist.init_process_group("gloo", init_method="file://" + os.path.join(run_dir, "init"),
                            rank=rank, world_size=world_size)
    value = torch.ones(1)
    dist.all_reduce(value)
    done = time.monotonic()
    if value.item() != world_size:
        raise RuntimeError(f"all_reduce gave {value.item()}, expected {world_size}")
    # Written atomically so the parent never reads half a number.
    path = os.path.join(run_dir, f"done.{rank}")
    with open(path + ".tmp", "w") as f:
        f.write(repr(done))
    os.rename(path + ".tmp", path)
    dist.destroy_process_group()


def measure_once(nproc):
    run_dir = tempfile.mkdtemp(prefix="meshrun-startup-torch-")
    try:
        start = time.monotonic()
        mp.spawn(rank_main, args=(nproc, run_dir), nprocs=nproc, join=True)
        finished = []
        for rank in range(nproc):
            with open(os.path.join(run_dir, f"done.{rank}")) as f:
                finished.append(float(f.read()))
        return (max(finished) - start) * 1e3
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.nproc < 1 or args.repeats < 1:
        print("error: --nproc and --repeats must be >= 1", file=sys.stderr)
        return 2

    runs = [measure_once(args.nproc) for _ in range(args.repeats)]
    median = statistics.median(runs)
    print(f"torch {torch.__version__}: {args.nproc} ranks, spawn -> gloo file:// init -> "
          f"first all_reduce, {args.repeats} runs")
    print(f"{'median ms':>10} {'min ms':>10} {'max ms':>10}")
    print(f"{median:10.1f} {min(runs):10.1f} {max(runs):10.1f}")
    print(json.dumps({"bench": "startup_torch", "torch": torch.__version__, "nproc": args.nproc,
                      "repeats": args.repeats, "median_ms": round(median, 1),
                      "runs_ms": [round(r, 1) for r in runs]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
