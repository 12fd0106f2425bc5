"""A Python gRPC client of meshrun, generated from proto/ at test time with grpcio-tools, that
submits a job starting from a Hugging Face folder (`model.init_from`) with no model sizes, on a
dp_shard 2 x tp 2 mesh, waits for it, then submits it again with more steps (it resumes from the
first job's checkpoint) and waits for that one too.

Run by tests/integration/one_spec_test.cc with the tests' virtual environment:
  python python_init_from.py --proto-dir proto --out DIR --coordinator HOST:PORT \
      --data DIR --train FILE
--data is the folder the coordinator cannot see; this script writes DATA/hf (config.json +
model.safetensors of a tiny GPT-2, written by hand: the format is a JSON header and raw bytes)
and names DATA/ckpt as checkpoint.dir. Prints one JSON object on stdout: {"jobs": [GetJob's
job as JSON, ...], "submit_error": ...}. Exit 0 when both jobs reached a terminal state.
"""

import argparse
import glob
import importlib
import json
import os
import random
import struct
import sys
import time

N_LAYER, N_HEAD, D, POSITIONS, VOCAB = 1, 2, 32, 32, 256


def generate(proto_dir, out):
    from grpc_tools import protoc
    import grpc_tools

    os.makedirs(out, exist_ok=True)
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    protos = sorted(glob.glob(os.path.join(proto_dir, "meshrun", "v1", "*.proto")))
    args = ["protoc", f"-I{proto_dir}", f"-I{include}", f"--python_out={out}",
            f"--grpc_python_out={out}"] + protos
    if protoc.main(args) != 0:
        raise SystemExit("grpc_tools.protoc failed")
    sys.path.insert(0, out)


def write_gpt2_folder(folder):
    """config.json + model.safetensors of a GPT2LMHeadModel (Conv1D weights stored (in, out))."""
    os.makedirs(folder, exist_ok=True)
    rng = random.Random(7)
    shapes = {"wte.weight": [VOCAB, D], "wpe.weight": [POSITIONS, D],
              "ln_f.weight": [D], "ln_f.bias": [D]}
    for i in range(N_LAYER):
        p = f"h.{i}."
        shapes.update({
            p + "ln_1.weight": [D], p + "ln_1.bias": [D],
            p + "attn.c_attn.weight": [D, 3 * D], p + "attn.c_attn.bias": [3 * D],
            p + "attn.c_proj.weight": [D, D], p + "attn.c_proj.bias": [D],
            p + "ln_2.weight": [D], p + "ln_2.bias": [D],
            p + "mlp.c_fc.weight": [D, 4 * D], p + "mlp.c_fc.bias": [4 * D],
            p + "mlp.c_proj.weight": [4 * D, D], p + "mlp.c_proj.bias": [D]})
    header, blobs, offset = {}, [], 0
    for name, shape in shapes.items():
        n = 1
        for s in shape:
            n *= s
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            values = [1.0] * n
        elif name.endswith(".bias"):
            values = [0.0] * n
        else:
            values = [rng.gauss(0.0, 0.02) for _ in range(n)]
        blob = struct.pack(f"<{n}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": N_LAYER,
              "n_head": N_HEAD, "n_embd": D, "n_positions": POSITIONS, "vocab_size": VOCAB,
              "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new"}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--proto-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--train", required=True)
    parser.add_argument("--timeout", type=float, default=45)
    a = parser.parse_args()

    generate(a.proto_dir, a.out)
    write_gpt2_folder(os.path.join(a.data, "hf"))
    import grpc
    from google.protobuf import json_format

    pb = importlib.import_module("meshrun.v1.coordinator_pb2")
    rpc = importlib.import_module("meshrun.v1.coordinator_pb2_grpc")
    spec_pb = importlib.import_module("meshrun.v1.job_spec_pb2")
    stub = rpc.CoordinatorServiceStub(grpc.insecure_channel(a.coordinator))

    def run(steps):
        # model: {init_from: DATA/hf}: no sizes, they are config.json's.
        spec = spec_pb.JobSpec(name="python-init-from")
        spec.model.init_from = os.path.join(a.data, "hf")
        spec.parallelism.dp_shard_size = 2
        spec.parallelism.tp_size = 2
        spec.train.steps = steps
        spec.train.global_batch_size = 4
        spec.train.micro_batch_size = 2
        spec.data.train = a.train
        spec.checkpoint.dir = os.path.join(a.data, "ckpt")
        reply = stub.SubmitJob(pb.SubmitJobRequest(spec=spec), timeout=30)
        terminal = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"}
        deadline = time.monotonic() + a.timeout
        job = {}
        while time.monotonic() < deadline:
            got = stub.GetJob(pb.GetJobRequest(job_id=reply.job_id), timeout=10).job
            job = json_format.MessageToDict(got, preserving_proto_field_name=True)
            if job.get("state") in terminal:
                break
            time.sleep(0.2)
        return job

    result = {"jobs": []}
    try:
        for steps in (2, 4):
            job = run(steps)
            result["jobs"].append(job)
            if job.get("state") != "JOB_STATE_SUCCEEDED":
                break
    except grpc.RpcError as e:
        result["submit_error"] = {"code": e.code().name, "message": e.details()}
    print(json.dumps(result))
    return 0 if len(result["jobs"]) == 2 else 1


if __name__ == "__main__":
    sys.exit(main())
