#!/usr/bin/env python3
"""bench/startup: how long `meshrun train --nproc 4` takes from launch to the first completed
training step of its 4 ranks, beside PyTorch's 4 spawned ranks reaching their first gloo
all_reduce (bench/startup_torch.py). Median of --repeats runs each; prints a table and a JSON
line {"bench":"startup",...}. Exits 1 with the error when meshrun's run fails (it never waits
longer than --timeout seconds per run).

meshrun's time is wall time from starting the process to its first {"event":"step"} line on
stdout (spawn, spec and data loading, model init, communicator bootstrap, one step); the run
is then left to finish its 2 steps and must exit 0. torch's is spawn to all_reduce only, so the
comparison is generous to torch.

  python3 bench/startup/startup.py [--meshrun build/bin/meshrun] [--repeats 5] [--timeout 120]
                                   [--torch-python /usr/bin/python3] [--no-torch]
"""

import argparse
import json
import os
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
NPROC = 4


def meshrun_command(binary):
    return [binary, "train", "-f", os.path.join(ROOT, "examples", "tiny.yaml"),
            "--nproc", str(NPROC), "-o", "json",
            "--set", f"parallelism.dp_replicate_size={NPROC}",
            "--set", "train.global_batch_size=8", "--set", "train.micro_batch_size=2",
            "--set", "train.steps=2", "--set", "checkpoint.dir="]


def stop(proc, grace=10.0):
    """SIGTERM, then SIGKILL after `grace` seconds (the launcher's ranks die with it)."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def failure_text(stderr_text, what):
    lines = [l for l in stderr_text.splitlines() if l.strip()]
    errors = [l for l in lines if l.startswith("error: ")]
    detail = errors[-1][len("error: "):] if errors else (
        " | ".join(lines[-3:]) if lines else "no output on stderr")
    return f"{what}: {detail}"


def measure_meshrun_once(binary, timeout):
    """Milliseconds to the first step line; raises RuntimeError with the run's error."""
    with tempfile.TemporaryFile(mode="w+") as err:
        start = time.monotonic()
        proc = subprocess.Popen(meshrun_command(binary), cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=err, stdin=subprocess.DEVNULL)
        first_step_ms = None
        pending = b""
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(proc.stdout, selectors.EVENT_READ)
                deadline = start + timeout
                eof = False
                while not eof:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        stop(proc)
                        raise RuntimeError(f"no step line within {timeout} s (run stopped)")
                    if not sel.select(timeout=left):
                        continue
                    chunk = os.read(proc.stdout.fileno(), 65536)
                    eof = not chunk
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        if first_step_ms is None and line.startswith(b'{"event":"step"'):
                            first_step_ms = (time.monotonic() - start) * 1e3
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            stop(proc)
            raise RuntimeError(f"did not finish within {timeout} s (run stopped)")
        finally:
            stop(proc)
            proc.stdout.close()
        err.seek(0)
        stderr_text = err.read()
    if proc.returncode != 0:
        raise RuntimeError(failure_text(stderr_text, f"exit code {proc.returncode}"))
    if first_step_ms is None:
        raise RuntimeError(failure_text(stderr_text, "exited 0 without a step line"))
    return first_step_ms


def measure_torch(python, repeats, timeout):
    script = os.path.join(ROOT, "bench", "startup_torch.py")
    try:
        done = subprocess.run([python, script, "--nproc", str(NPROC), "--repeats", str(repeats)],
                              capture_output=True, text=True, timeout=timeout * repeats)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{python} {script}: {e}"
    if done.returncode != 0:
        return None, failure_text(done.stderr, f"{script} exit code {done.returncode}")
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line), None
    return None, f"{script} printed no JSON line"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--meshrun", default=os.path.join(ROOT, "build", "bin", "meshrun"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per run")
    parser.add_argument("--torch-python", default="/usr/bin/python3")
    parser.add_argument("--no-torch", action="store_true")
    args = parser.parse_args()
    if args.repeats < 1 or args.timeout <= 0:
        print("error: --repeats: must be >= 1 and --timeout > 0 (hint: use the defaults)",
              file=sys.stderr)
        return 2

    meshrun_runs, meshrun_error = [], None
    if not os.access(args.meshrun, os.X_OK):
        meshrun_error = (f"--meshrun: {args.meshrun} is not an executable (hint: build it with "
                         f"`cmake --build build --target meshrun_cli` or pass --meshrun PATH)")
    else:
        for _ in range(args.repeats):
            try:
                meshrun_runs.append(measure_meshrun_once(args.meshrun, args.timeout))
            except RuntimeError as e:
                meshrun_error = f"meshrun train --nproc {NPROC} failed: {e}"
                break
    torch_result, torch_error = (None, None) if args.no_torch else measure_torch(
        args.torch_python, args.repeats, args.timeout)

    meshrun_ms = statistics.median(meshrun_runs) if not meshrun_error else None
    torch_ms = torch_result["median_ms"] if torch_result else None
    ratio = meshrun_ms / torch_ms if meshrun_ms and torch_ms else None

    def cell(v, fmt="{:.1f}"):
        return fmt.format(v) if v is not None else "-"

    print(f"startup: {NPROC} ranks, median of {args.repeats} runs")
    print(f"{'what':<48} {'median ms':>10} {'min ms':>9} {'max ms':>9}")
    rows = [("meshrun train --nproc 4 (to first step)", meshrun_ms,
             meshrun_runs if meshrun_ms else None),
            ("torch spawn + gloo (to first all_reduce)", torch_ms,
             torch_result["runs_ms"] if torch_result else None)]
    for name, median, runs in rows:
        print(f"{name:<48} {cell(median):>10} {cell(min(runs) if runs else None):>9} "
              f"{cell(max(runs) if runs else None):>9}")
    print(f"{'ratio meshrun / torch':<48} {cell(ratio, '{:.2f}'):>10}")
    for e in (meshrun_error, torch_error):
        if e:
            print(f"error: {e}", file=sys.stderr)
    print(json.dumps({"bench": "startup", "nproc": NPROC, "repeats": args.repeats,
                      "meshrun_ms": None if meshrun_ms is None else round(meshrun_ms, 1),
                      "meshrun_runs_ms": [round(r, 1) for r in meshrun_runs],
                      "torch_ms": torch_ms,
                      "torch_runs_ms": torch_result["runs_ms"] if torch_result else [],
                      "ratio": None if ratio is None else round(ratio, 3),
                      "ok": not (meshrun_error or torch_error),
                      "error": meshrun_error or torch_error}))
    return 1 if (meshrun_error or torch_error) else 0


if __name__ == "__main__":
    sys.exit(main())
