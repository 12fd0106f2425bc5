// The NCCL backend on one GPU: world bootstrap through the Store, a group split from the world,
// a group bootstrapped on its own id, size-1 device groups, ConnectMesh by device, and the abort
// path (a peer that never joins ends in DEADLINE_EXCEEDED within the timeout instead of a hang).
// Collectives between two ranks need two GPUs (NCCL refuses two ranks on one device) and are not
// exercised here.
#include "engine/comm/nccl_communicator.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/comm/backend_factory.h"
#include "engine/comm/store.h"
#include "tests/gpu/gpu_test.h"

namespace meshrun {
namespace {

using gpu::NcclBackend;
using std::chrono::milliseconds;

CommConfig Config(const std::string& group, int rank, int size, milliseconds timeout) {
  CommConfig c;
  c.axis = MeshAxis::kTp;
  c.group_id = group;
  c.rank = rank;
  c.size = size;
  c.timeout = timeout;
  return c;
}

GPU_TEST(VersionIsKnown) {
  const std::string v = gpu::NcclVersion();
  std::printf("  NCCL %s\n", v.c_str());
  EXPECT_TRUE(v != "unknown" && !v.empty());
}

GPU_TEST(WorldOfOneAndSplit) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<NcclBackend> backend, NcclBackend::Create());
  auto store = std::make_shared<InMemoryStore>();
  ASSERT_OK(backend->InitWorld(store, 0, 1, milliseconds(20000)));
  EXPECT_TRUE(backend->has_world());
  auto group_store = std::make_shared<PrefixStore>("comm/tp/0", store);
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Communicator> comm,
      backend->Connect(Config("comm/tp/0", 0, 1, milliseconds(20000)), group_store));
  EXPECT_TRUE(comm->size() == 1 && comm->rank() == 0);
  float* data = nullptr;
  ASSERT_OK(gpu::ToStatus(cudaMalloc(reinterpret_cast<void**>(&data), 16 * sizeof(float)),
                          "cudaMalloc", __FILE__, __LINE__));
  ASSERT_OK(comm->AllReduce(data, 16));  // size 1: returns at once
  ASSERT_OK(comm->Barrier());
  cudaFree(data);
  EXPECT_TRUE(comm->health().ok());
}

GPU_TEST(GroupOnItsOwnId) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<NcclBackend> backend, NcclBackend::Create());
  auto store = std::make_shared<InMemoryStore>();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> comm,
                       backend->Connect(Config("comm/dp/0", 0, 1, milliseconds(20000)), store));
  EXPECT_TRUE(comm->size() == 1);
}

GPU_TEST(MissingPeerTimesOutAndAborts) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<NcclBackend> backend, NcclBackend::Create());
  auto store = std::make_shared<InMemoryStore>();
  const auto start = std::chrono::steady_clock::now();
  // Rank 0 of a 2-rank group whose rank 1 never comes: init must give up after the timeout.
  auto comm = backend->Connect(Config("comm/tp/7", 0, 2, milliseconds(3000)), store);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("  gave up after %.2f s: %s\n", s,
              comm.ok() ? "OK" : comm.status().ToString().c_str());
  EXPECT_TRUE(!comm.ok());
  EXPECT_TRUE(!comm.ok() && comm.status().code() == StatusCode::kDeadlineExceeded);

  // Rank 1 of a group whose rank 0 never publishes the id: the store wait is bounded too.
  auto other = backend->Connect(Config("comm/tp/8", 1, 2, milliseconds(500)),
                                std::make_shared<InMemoryStore>());
  EXPECT_TRUE(!other.ok() && other.status().code() == StatusCode::kDeadlineExceeded);
  gpu::ClearFirstGpuError();  // expected errors: keep the harness's report clean
}

// Size-1 groups of a device mesh copy device memory on the compute stream (not memmove), for
// the blocking and the asynchronous calls alike.
GPU_TEST(DeviceSoloCopiesOnTheDevice) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<NcclBackend> backend, NcclBackend::Create());
  std::unique_ptr<Communicator> solo =
      backend->MakeSolo(Config("comm/tp/0", 0, 1, milliseconds(5000)));
  cudaStream_t stream = nullptr;
  ASSERT_OK(gpu::ToStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                          "cudaStreamCreateWithFlags", __FILE__, __LINE__));
  solo->SetComputeStream(stream);
  std::vector<float> host(64);
  for (int i = 0; i < 64; ++i) host[i] = static_cast<float>(i) * 0.5f;
  float *in = nullptr, *out = nullptr;
  ASSERT_OK(gpu::ToStatus(cudaMalloc(reinterpret_cast<void**>(&in), 64 * sizeof(float)),
                          "cudaMalloc", __FILE__, __LINE__));
  ASSERT_OK(gpu::ToStatus(cudaMalloc(reinterpret_cast<void**>(&out), 64 * sizeof(float)),
                          "cudaMalloc", __FILE__, __LINE__));
  ASSERT_OK(gpu::ToStatus(cudaMemcpy(in, host.data(), 64 * sizeof(float), cudaMemcpyHostToDevice),
                          "cudaMemcpy", __FILE__, __LINE__));
  // A pageable upload may still be landing on the legacy stream: wait before the collectives.
  ASSERT_OK(gpu::ToStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize", __FILE__, __LINE__));
  ASSERT_OK(solo->AllGather(in, out, 32));
  ASSERT_OK_AND_ASSIGN(CommWork work, solo->StartReduceScatter(in + 32, out + 32, 32));
  ASSERT_OK(solo->Wait(work));
  ASSERT_OK(
      gpu::ToStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize", __FILE__, __LINE__));
  std::vector<float> back(64, -1.f);
  ASSERT_OK(gpu::ToStatus(cudaMemcpy(back.data(), out, 64 * sizeof(float), cudaMemcpyDeviceToHost),
                          "cudaMemcpy", __FILE__, __LINE__));
  EXPECT_TRUE(back == host);
  EXPECT_TRUE(gpu::FirstGpuError().ok());
  cudaFree(in);
  cudaFree(out);
  cudaStreamDestroy(stream);
}

// The product's path: ConnectMesh by device, the world through the store, every axis of a
// one-rank mesh.
GPU_TEST(ConnectMeshOnCuda) {
  ASSERT_OK_AND_ASSIGN(ParallelDims dims, ParallelDims::Create(1, 1, 1, 1));
  auto store = std::make_shared<InMemoryStore>();
  MeshCommsOptions options;
  options.timeout = milliseconds(20000);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<MeshComms> mesh,
                       ConnectMesh("cuda", dims, 0, store, std::make_shared<CommStats>(), options));
  EXPECT_TRUE(mesh->Get(MeshAxis::kTp).size() == 1);
  EXPECT_TRUE(mesh->Get(MeshAxis::kDpShardCp).health().ok());
}

}  // namespace
}  // namespace meshrun

GPU_TEST_MAIN()
