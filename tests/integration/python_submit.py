"""A Python gRPC client of meshrun, generated from proto/ at test time with grpcio-tools, that
submits a minimal job spec (only the fields a YAML user writes) and waits for the job to end.

Run by tests/integration/python_client_test.cc with the tests' virtual environment:
  python python_submit.py --proto-dir proto --out DIR --coordinator HOST:PORT --train FILE
Prints one JSON object on stdout: {"grpcio_tools": version, "job_id": ..., "job": GetJob's job
as JSON (json_format field names), "submit_error": code and message when SubmitJob refused}.
Exit 0 when the job reached a terminal state (whichever) or SubmitJob refused; 1 otherwise.
"""

import argparse
import glob
import importlib
import json
import os
import sys
import time


def generate(proto_dir, out):
    from grpc_tools import protoc
    import grpc_tools

    os.makedirs(out, exist_ok=True)
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    protos = sorted(glob.glob(os.path.join(proto_dir, "meshrun", "v1", "*.proto")))
    if not protos:
        raise SystemExit(f"no .proto files under {proto_dir}/meshrun/v1")
    args = ["protoc", f"-I{proto_dir}", f"-I{include}", f"--python_out={out}",
            f"--grpc_python_out={out}"] + protos
    if protoc.main(args) != 0:
        raise SystemExit("grpc_tools.protoc failed on " + " ".join(protos))
    sys.path.insert(0, out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--proto-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--train", required=True)
    parser.add_argument("--timeout", type=float, default=240)
    a = parser.parse_args()

    generate(a.proto_dir, a.out)
    import grpc
    from google.protobuf import json_format
    from importlib.metadata import version

    pb = importlib.import_module("meshrun.v1.coordinator_pb2")
    rpc = importlib.import_module("meshrun.v1.coordinator_pb2_grpc")
    spec_pb = importlib.import_module("meshrun.v1.job_spec_pb2")

    # What a YAML user writes, nothing more:
    #   name: python-minimal
    #   model: {n_layer: 1, n_head: 2, d_model: 32, seq_len: 32, vocab_size: 256}
    #   parallelism: {dp_shard_size: 2}
    #   train: {steps: 3, global_batch_size: 4, micro_batch_size: 2}
    #   data: {train: FILE}
    spec = spec_pb.JobSpec(name="python-minimal")
    spec.model.n_layer = 1
    spec.model.n_head = 2
    spec.model.d_model = 32
    spec.model.seq_len = 32
    spec.model.vocab_size = 256
    spec.parallelism.dp_shard_size = 2
    spec.train.steps = 3
    spec.train.global_batch_size = 4
    spec.train.micro_batch_size = 2
    spec.data.train = a.train

    result = {"grpcio_tools": version("grpcio-tools")}
    channel = grpc.insecure_channel(a.coordinator)
    stub = rpc.CoordinatorServiceStub(channel)
    try:
        reply = stub.SubmitJob(pb.SubmitJobRequest(spec=spec), timeout=30)
    except grpc.RpcError as e:
        result["submit_error"] = {"code": e.code().name, "message": e.details()}
        print(json.dumps(result))
        return 0
    result["job_id"] = reply.job_id
    terminal = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"}
    deadline = time.monotonic() + a.timeout
    job = {}
    while time.monotonic() < deadline:
        reply_job = stub.GetJob(pb.GetJobRequest(job_id=reply.job_id), timeout=10).job
        job = json_format.MessageToDict(reply_job, preserving_proto_field_name=True)
        if job.get("state") in terminal:
            break
        time.sleep(0.5)
    result["job"] = job
    print(json.dumps(result))
    return 0 if job.get("state") in terminal else 1


if __name__ == "__main__":
    sys.exit(main())
