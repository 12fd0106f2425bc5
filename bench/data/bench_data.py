#!/usr/bin/env python3
"""bench/data: what a rank pays for a large token dataset. Writes llm.c token shards (version 1,
uint16, random ids) under --dir, trains examples/tiny.yaml on them with `meshrun train --nproc 4`
(dp_replicate 4, model.vocab_size 65536) for a few steps, and measures each rank's peak RSS
(VmHWM of /proc/PID/status, polled until the rank exits) and the wall time from launch to the
first {"event":"step"} line; then the same job on a small dataset (one shard of --small-mb).
Prints a table and a JSON line {"bench":"data",...}; deletes the data it wrote unless --keep.
Exits 1 when a run fails (never waiting longer than --timeout seconds per run).

  python3 bench/data/bench_data.py [--meshrun build/bin/meshrun] [--dir /tmp/meshrun-bench-data]
      [--tokens 5.5e9] [--shards 50] [--small-mb 10] [--steps 3] [--repeats 3]
      [--order sequential|shuffled] [--keep]
"""

import argparse
import json
import os
import selectors
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
NPROC = 4
MAGIC, VERSION = 20240520, 1
BLOCK = os.urandom(16 << 20)  # random ids, reused at shifting offsets (content is irrelevant)


def write_shard(path, n_tokens, salt):
    header = struct.pack("<256i", MAGIC, VERSION, n_tokens, *([0] * 253))
    left = 2 * n_tokens
    off = (salt * 4099 * 2) % (len(BLOCK) // 2)
    with open(path, "wb") as f:
        f.write(header)
        while left > 0:
            chunk = BLOCK[off:off + min(left, len(BLOCK) - off)]
            f.write(chunk)
            left -= len(chunk)
            off = 0


def make_dataset(folder, n_tokens, n_shards):
    os.makedirs(folder, exist_ok=True)
    per = n_tokens // n_shards
    for i in range(n_shards):
        n = per if i < n_shards - 1 else n_tokens - per * (n_shards - 1)
        write_shard(os.path.join(folder, f"train_{i:06d}.bin"), n, i)


def descendants(pid):
    kids, frontier = set(), [pid]
    ppid_of = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid_of[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    while frontier:
        p = frontier.pop()
        for c, pp in ppid_of.items():
            if pp == p and c not in kids:
                kids.add(c)
                frontier.append(c)
    return kids


def vm_hwm_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_parts_kb(pid):
    """(RssAnon, RssFile) now: the rank's own memory, and the page-cache pages it has mapped
    (the mapped shards' pages, shared with every rank of the host)."""
    anon = file = None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    anon = int(line.split()[1])
                elif line.startswith("RssFile:"):
                    file = int(line.split()[1])
    except OSError:
        return None
    return None if anon is None or file is None else (anon, file)


def run_once(meshrun, data, steps, timeout, order):
    """(ms to the first step line, [peak RSS MiB of each rank], [(peak RssAnon MiB, peak RssFile
    MiB) of each rank]); RuntimeError on failure."""
    cmd = [meshrun, "train", "-f", os.path.join(ROOT, "examples", "tiny.yaml"),
           "--nproc", str(NPROC), "-o", "json",
           "--set", f"parallelism.dp_replicate_size={NPROC}", "--set", f"data.train={data}",
           "--set", "data.val=", "--set", "data.format=auto",
           "--set", "model.vocab_size=65536", "--set", f"data.order={order}",
           "--set", f"train.steps={steps}", "--set", "checkpoint.dir="]
    with tempfile.TemporaryFile(mode="w+") as err:
        start = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err,
                                stdin=subprocess.DEVNULL)
        first_ms, pending, peak, last_scan = None, b"", {}, 0.0
        parts = {}  # pid -> [max RssAnon, max RssFile] seen while polling
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(proc.stdout, selectors.EVENT_READ)
                eof = False
                while not eof:
                    now = time.monotonic()
                    if now - start > timeout:
                        raise RuntimeError(f"not done within {timeout} s (run stopped)")
                    if now - last_scan > 0.25:
                        last_scan = now
                        for p in descendants(proc.pid):
                            peak.setdefault(p, 0)
                    for p in peak:  # VmHWM only grows: the last read is the peak
                        v = vm_hwm_kb(p)
                        if v is not None:
                            peak[p] = max(peak[p], v)
                        r = rss_parts_kb(p)
                        if r is not None:
                            m = parts.setdefault(p, [0, 0])
                            m[0], m[1] = max(m[0], r[0]), max(m[1], r[1])
                    if sel.select(timeout=0.02):
                        chunk = os.read(proc.stdout.fileno(), 65536)
                        eof = not chunk
                        pending += chunk
                        *lines, pending = pending.split(b"\n")
                        for line in lines:
                            if first_ms is None and line.startswith(b'{"event":"step"'):
                                first_ms = (time.monotonic() - start) * 1e3
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait()
            proc.stdout.close()
        err.seek(0)
        stderr_text = err.read()
    if proc.returncode != 0:
        raise RuntimeError(f"exit code {proc.returncode}: {stderr_text.strip()[-400:]}")
    if first_ms is None:
        raise RuntimeError("no step line")
    # The ranks: the descendants whose peak is a trainer's (the launcher's helpers are small).
    top = sorted((p for p in peak if peak[p] > 0), key=lambda p: -peak[p])[:NPROC]
    ranks = [peak[p] / 1024 for p in top]
    split = [tuple(x / 1024 for x in parts.get(p, (0, 0))) for p in top]
    return first_ms, ranks, split


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--meshrun", default=os.path.join(ROOT, "build", "bin", "meshrun"))
    ap.add_argument("--dir", default="/tmp/meshrun-bench-data",
                    help="where the data is written (never the repository); deleted afterwards")
    ap.add_argument("--tokens", type=float, default=5.5e9)
    ap.add_argument("--shards", type=int, default=50)
    ap.add_argument("--small-mb", type=float, default=10)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--order", default="sequential", choices=["sequential", "shuffled"],
                    help="data.order (shuffled computes each window's place: nothing stored)")
    ap.add_argument("--keep", action="store_true", help="leave the data on disk")
    a = ap.parse_args()
    big, small = os.path.join(a.dir, "big"), os.path.join(a.dir, "small")
    load_start = os.getloadavg()
    try:
        t0 = time.monotonic()
        if not os.path.isdir(big):
            make_dataset(big, int(a.tokens), a.shards)
        if not os.path.isdir(small):
            make_dataset(small, int(a.small_mb * 1e6 / 2), 1)
        write_s = time.monotonic() - t0
        sizes = {k: sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
                 for k, d in (("big", big), ("small", small))}
        results = {"small": [], "big": []}
        for _ in range(a.repeats):  # interleaved, so load bursts hit both alike
            for name, path in (("small", os.path.join(small, "train_*.bin")),
                               ("big", os.path.join(big, "train_*.bin"))):
                results[name].append(run_once(a.meshrun, path, a.steps, a.timeout, a.order))
    except RuntimeError as e:
        print(f"error: meshrun train --nproc {NPROC} failed: {e}", file=sys.stderr)
        return 1
    finally:
        if not a.keep:
            shutil.rmtree(a.dir, ignore_errors=True)
    load_end = os.getloadavg()
    out = {"bench": "data", "nproc": NPROC, "steps": a.steps, "order": a.order,
           "write_s": round(write_s, 1), "cores": os.cpu_count(),
           "load_average_start": [round(x, 2) for x in load_start],
           "load_average_end": [round(x, 2) for x in load_end]}
    print(f"load average (1, 5, 15 min) at the start {load_start[0]:.2f} {load_start[1]:.2f} "
          f"{load_start[2]:.2f}, at the end {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}"
          f" ({os.cpu_count()} cores)")
    print(f"{'dataset':<8} {'bytes':>15} {'first step ms (median)':>23} "
          f"{'peak rank RSS MiB (max over ranks, median of runs)':>52}")
    for name in ("small", "big"):
        ms = statistics.median(r[0] for r in results[name])
        rss = statistics.median(max(r[1]) for r in results[name])
        out[name] = {"bytes": sizes[name], "first_step_ms": [round(r[0]) for r in results[name]],
                     "rank_rss_mib": [[round(x, 1) for x in r[1]] for r in results[name]],
                     "median_first_step_ms": round(ms), "median_max_rank_rss_mib": round(rss, 1)}
        anon = statistics.median(max(a for a, _ in r[2]) for r in results[name])
        filed = statistics.median(max(f for _, f in r[2]) for r in results[name])
        out[name]["median_max_rank_rss_anon_mib"] = round(anon, 1)
        out[name]["median_max_rank_rss_file_mib"] = round(filed, 1)
        print(f"{name:<8} {sizes[name]:>15,} {ms:>23,.0f} {rss:>52,.1f}   "
              f"(anon {anon:,.1f}, file {filed:,.1f})")
    d_ms = out["big"]["median_first_step_ms"] - out["small"]["median_first_step_ms"]
    d_rss = out["big"]["median_max_rank_rss_mib"] - out["small"]["median_max_rank_rss_mib"]
    print(f"big − small: first step {d_ms:+,} ms, peak rank RSS {d_rss:+.1f} MiB")
    out["delta_first_step_ms"], out["delta_rss_mib"] = d_ms, round(d_rss, 1)
    out["delta_rss_anon_mib"] = round(out["big"]["median_max_rank_rss_anon_mib"] -
                                      out["small"]["median_max_rank_rss_anon_mib"], 1)
    out["delta_rss_file_mib"] = round(out["big"]["median_max_rank_rss_file_mib"] -
                                      out["small"]["median_max_rank_rss_file_mib"], 1)
    print(f"of which anonymous (the rank's own) {out['delta_rss_anon_mib']:+.1f} MiB, "
          f"file-backed (mapped page cache, shared) {out['delta_rss_file_mib']:+.1f} MiB")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
