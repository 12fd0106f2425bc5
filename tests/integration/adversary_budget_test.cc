// The attacks of the third security review on what a job or a worker makes the coordinator
// keep, each performed as it was found: an in-process coordinator serving mutual TLS with
// tokens, a fake worker holding a real worker certificate (as a compromised worker would),
// clients written against the protos. Each attack is refused or bounded (docs/security.md
// "Limits"): the coordinator's memory (VmRSS of this process, which runs it) and its state
// database stay within 100 MB of their baselines, the /metrics page stays small, `logs` keeps
// answering, and a checkpoint outside the job's checkpoint.dir is never resumed from. Loopback
// only; every wait bounded; no assertion on elapsed time.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/tls.h"
#include "coordinator/server.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "tests/coordinator/test_util.h"
#include "tests/fakes/fake_grpc_worker.h"
#include "tests/integration/mutual_tls_coordinator.h"
#include "tests/integration/test_certs.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr char kBudgetToken[] = "adversary-budget-token";
constexpr int64_t kBudgetMiB = 1 << 20;
// How much the coordinator may grow through one attack.
constexpr int64_t kBudgetGrowthBound = 100 * kBudgetMiB;

// VmRSS of this process, which runs the coordinator.
int64_t BudgetRssBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return 0;
}

class AdversaryBudgetTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new testing::TestCerts();
    dir_ = new testing::TempDir();
    if (!certs_->Generate(fs::path(dir_->path()) / "certs", {"worker-a"})) skip_ = certs_->error;
  }
  static void TearDownTestSuite() {
    delete certs_;
    delete dir_;
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    const std::string token_file = (fs::path(state_.path()) / "tokens").string();
    std::ofstream(token_file) << kBudgetToken << "\n";
    coordinator::CoordinatorConfig config =
        testing::MutualTlsConfig(*certs_, (fs::path(state_.path()) / "state").string(), token_file);
    config.metrics_listen = "127.0.0.1:0";
    auto server = coordinator::CoordinatorServer::Start(config);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    address_ = "127.0.0.1:" + std::to_string(server_->port());
    client_ = v1::CoordinatorService::NewStub(Channel(""));
    worker_ = std::make_unique<testing::FakeGrpcWorker>(Channel("worker-a"), "worker-a", 2);
    ASSERT_TRUE(worker_->Register().ok());
    worker_->Open();
    ASSERT_TRUE(worker_->WaitAccepted());
  }

  std::shared_ptr<grpc::Channel> Channel(const std::string& client) {
    return testing::MutualTlsChannel(*certs_, address_, client);
  }
  void Authorize(grpc::ClientContext* ctx) {
    ctx->set_deadline(std::chrono::system_clock::now() + 20s);
    ctx->AddMetadata("authorization", std::string("Bearer ") + kBudgetToken);
  }

  // A job of two ranks (one tp group) on worker-a, both started; `dir`: its checkpoint.dir.
  std::vector<v1::RankAssignment> PlaceJob(std::string* id, const std::string& dir = "",
                                           int max_restarts = 0) {
    v1::SubmitJobRequest request = testing::SubmitRequest(1, 1, 1, 2, max_restarts);
    if (!dir.empty()) request.mutable_spec()->mutable_checkpoint()->set_dir(dir);
    grpc::ClientContext ctx;
    Authorize(&ctx);
    v1::SubmitJobResponse response;
    grpc::Status s = client_->SubmitJob(&ctx, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    *id = response.job_id();
    std::vector<v1::RankAssignment> assigned = worker_->TakeAssignments(2, 10s);
    EXPECT_EQ(assigned.size(), 2u);
    for (const auto& a : assigned) EXPECT_TRUE(worker_->Started(a));
    return assigned;
  }
  v1::Job GetJob(const std::string& id) {
    grpc::ClientContext ctx;
    Authorize(&ctx);
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::GetJobResponse resp;
    grpc::Status s = client_->GetJob(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.job();
  }
  grpc::Status Logs(const std::string& id, v1::GetJobLogsResponse* out) {
    grpc::ClientContext ctx;
    Authorize(&ctx);
    v1::GetJobLogsRequest req;
    req.set_job_id(id);
    return client_->GetJobLogs(&ctx, req, out);
  }
  void Cancel(const std::string& id) {
    grpc::ClientContext ctx;
    Authorize(&ctx);
    v1::CancelJobRequest req;
    req.set_job_id(id);
    v1::CancelJobResponse resp;
    grpc::Status s = client_->CancelJob(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  // Bytes of the state database (with its write-ahead log).
  int64_t DbBytes() const {
    int64_t bytes = 0;
    for (const char* name : {"coordinator.db", "coordinator.db-wal"}) {
      std::error_code ec;
      const auto size = fs::file_size(fs::path(state_.path()) / "state" / name, ec);
      if (!ec) bytes += static_cast<int64_t>(size);
    }
    return bytes;
  }
  // A log line of rank 0 whose arrival shows that every message sent before it was handled.
  void SendMarkerAndWait(const v1::RankAssignment& a, const std::string& marker) {
    v1::WorkerSessionRequest m;
    v1::LogLine* line = m.mutable_logs()->add_lines();
    line->set_job_id(a.job_id());
    line->set_attempt(a.attempt());
    line->set_rank(a.rank());
    line->set_text(marker);
    ASSERT_TRUE(worker_->Send(m));
    ASSERT_TRUE(testing::WaitFor(
        [&] {
          v1::GetJobLogsResponse logs;
          return Logs(a.job_id(), &logs).ok() && logs.lines_size() > 0 &&
                 logs.lines(logs.lines_size() - 1).text() == marker;
        },
        30s))
        << marker;
  }
  std::string Scrape() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(server_->metrics_port());
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    std::string body;
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      const std::string request = "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n";
      if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
        char buf[65536];
        ssize_t n;
        while ((n = read(fd, buf, sizeof(buf))) > 0) body.append(buf, n);
      }
    }
    close(fd);
    return body;
  }

  static testing::TestCerts* certs_;
  static testing::TempDir* dir_;
  static std::string skip_;
  testing::TempDir state_;
  std::unique_ptr<coordinator::CoordinatorServer> server_;
  std::string address_;
  std::unique_ptr<v1::CoordinatorService::Stub> client_;
  std::unique_ptr<testing::FakeGrpcWorker> worker_;
};

testing::TestCerts* AdversaryBudgetTest::certs_ = nullptr;
testing::TempDir* AdversaryBudgetTest::dir_ = nullptr;
std::string AdversaryBudgetTest::skip_;

// Attack: 1 MB log lines, 150 of them. They were stored whole (the 16 KiB cut ran before the
// text was filled in): 150 MB in memory and in the database, and `meshrun logs` failed for
// every reader once the answer passed gRPC's message size.
TEST_F(AdversaryBudgetTest, MegabyteLogLinesAreCutAndLogsStillAnswers) {
  std::string job;
  const std::vector<v1::RankAssignment> ranks = PlaceJob(&job);
  ASSERT_EQ(ranks.size(), 2u);
  SendMarkerAndWait(ranks[0], "baseline");
  const int64_t rss = BudgetRssBytes(), db = DbBytes();
  const std::string megabyte(1 << 20, 'm');
  for (int batch = 0; batch < 75; ++batch) {
    v1::WorkerSessionRequest m;
    for (const v1::RankAssignment& a : ranks) {
      v1::LogLine* line = m.mutable_logs()->add_lines();
      line->set_job_id(job);
      line->set_attempt(a.attempt());
      line->set_rank(a.rank());
      line->set_text(megabyte);
    }
    ASSERT_TRUE(worker_->Send(m));
    // Paced, so that what waits in this process's send queue stays small.
    if (batch % 10 == 9) SendMarkerAndWait(ranks[0], "after batch " + std::to_string(batch));
  }
  SendMarkerAndWait(ranks[0], "last");
  EXPECT_LT(BudgetRssBytes() - rss, kBudgetGrowthBound);
  EXPECT_LT(DbBytes() - db, kBudgetGrowthBound);

  v1::GetJobLogsResponse logs;
  grpc::Status s = Logs(job, &logs);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_LT(logs.ByteSizeLong(), static_cast<size_t>(4 * kBudgetMiB));
  ASSERT_GT(logs.lines_size(), 2);
  EXPECT_EQ(logs.lines(logs.lines_size() - 1).text(), "last");
  const std::string& cut = logs.lines(logs.lines_size() - 2).text();
  EXPECT_LE(cut.size(), 16u * 1024 + 64) << "16 KiB and the marker";
  EXPECT_NE(cut.find("line cut, it had 1048576 bytes"), std::string::npos) << cut.substr(16000);

  // After cancel the job's rank-level state goes, its lines stay readable.
  Cancel(job);
  ASSERT_TRUE(testing::WaitFor([&] { return GetJob(job).state() == v1::JOB_STATE_CANCELLED; }));
  s = Logs(job, &logs);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_GT(logs.lines_size(), 0);
}

// Attack: checkpoint_saved with a 3.5 MB path, 60 times: the coordinator's memory grew by
// 300 MB and its database by 220 MB, and kept both after cancel. Then reports of paths outside
// the job's checkpoint.dir (another job's folder) that the next attempt would resume from.
TEST_F(AdversaryBudgetTest, CheckpointReportsAreBoundedAndConfinedToTheJobsFolder) {
  const std::string dir = (fs::path(state_.path()) / "ckpt" / "a").string();
  const std::string other = (fs::path(state_.path()) / "ckpt" / "b").string();
  std::string job;
  const std::vector<v1::RankAssignment> ranks = PlaceJob(&job, dir, /*max_restarts=*/1);
  ASSERT_EQ(ranks.size(), 2u);
  const std::string own_dir = GetJob(job).spec().checkpoint().dir();
  ASSERT_FALSE(own_dir.empty());
  const int64_t rss = BudgetRssBytes(), db = DbBytes();
  auto report = [&](int64_t step, const std::string& path) {
    v1::WorkerSessionRequest m;
    v1::CheckpointSaved* saved = m.mutable_checkpoint_saved();
    saved->set_job_id(job);
    saved->set_attempt(ranks[0].attempt());
    saved->set_step(step);
    saved->set_path(path);
    return worker_->Send(m);
  };
  // A path over PATH_MAX ends the session that sent it.
  ASSERT_TRUE(report(1, own_dir + "/" + std::string(3'500'000, 'p')));
  std::optional<grpc::Status> ended = worker_->WaitEnded(10s);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->error_code(), grpc::StatusCode::INVALID_ARGUMENT) << ended->error_message();
  EXPECT_EQ(ended->error_message().rfind("checkpoint_saved.path: 3500", 0), 0u)
      << ended->error_message();
  worker_->Open(
      {testing::FakeGrpcWorker::Running(ranks[0]), testing::FakeGrpcWorker::Running(ranks[1])});
  ASSERT_TRUE(worker_->WaitAccepted());
  // 60 more of 4,000 bytes, each outside the job's folder: each refused.
  for (int i = 0; i < 60; ++i) {
    ASSERT_TRUE(report(5, other + "/" + std::string(4000 - other.size() - 1, 'q')));
  }
  ASSERT_TRUE(report(5, other + "/step-00000005"));         // another job's folder
  ASSERT_TRUE(report(5, own_dir + "/../b/step-00000005"));  // out through ..
  ASSERT_TRUE(report(2, own_dir + "/step-00000002"));       // the job's own: accepted
  ASSERT_TRUE(report(6, own_dir + "/../a/step-00000006"));  // .. even when it stays in
  SendMarkerAndWait(ranks[0], "reports sent");
  const v1::Job j = GetJob(job);
  EXPECT_EQ(j.last_checkpoint(), own_dir + "/step-00000002");
  EXPECT_LT(BudgetRssBytes() - rss, kBudgetGrowthBound);
  EXPECT_LT(DbBytes() - db, kBudgetGrowthBound);
  // Where the next attempt resumes is rank 0's choice in checkpoint.dir (decision 0048): the
  // coordinator only records the job's own reports, as above.
}

// Attack: rank samples carrying thousands of distinct out-of-range `op` values each (and a
// rank outside the job's mesh): each value became a series, a 57 MB /metrics page of duplicate
// series from 2.2 MB of samples.
TEST_F(AdversaryBudgetTest, OutOfRangeLabelValuesMakeNoSeries) {
  std::string job;
  const std::vector<v1::RankAssignment> ranks = PlaceJob(&job);
  ASSERT_EQ(ranks.size(), 2u);
  const int64_t rss = BudgetRssBytes();
  for (int step = 1; step <= 4; ++step) {
    for (int rank : {0, 1, 5}) {
      v1::WorkerSessionRequest m;
      v1::MetricsSample* s = m.mutable_metrics()->mutable_sample();
      s->set_job_id(job);
      s->set_attempt(ranks[0].attempt());
      s->set_rank(rank);
      s->set_step(step);
      s->set_step_seconds(0.5);
      v1::CommStats* real = s->add_comm();
      real->set_axis(v1::MESH_AXIS_TP);
      real->set_op(v1::COMM_OP_ALL_REDUCE);
      real->set_bytes(1000);
      for (int i = 0; i < 5000; ++i) {
        v1::CommStats* c = s->add_comm();
        c->set_axis(i % 2 ? v1::MESH_AXIS_TP : static_cast<v1::MeshAxis>(1000 + i));
        c->set_op(static_cast<v1::CommOp>(100 + step * 5000 + i));
        c->set_bytes(1);
      }
      ASSERT_TRUE(worker_->Send(m));
    }
    SendMarkerAndWait(ranks[0], "step " + std::to_string(step));
  }
  ASSERT_TRUE(testing::WaitFor([&] { return GetJob(job).step() == 4; }));
  const std::string page = Scrape();
  ASSERT_NE(page.find("meshrun_rank_comm_bytes_total{job_id=\"" + job), std::string::npos)
      << page.substr(0, 2000);
  EXPECT_LT(page.size(), 256u * 1024) << "a handful of series per rank";
  EXPECT_EQ(page.find("op=\"\""), std::string::npos);
  EXPECT_EQ(page.find("rank=\"5\""), std::string::npos) << "rank 5 is outside the 2-rank mesh";
  EXPECT_LT(BudgetRssBytes() - rss, kBudgetGrowthBound);
}

// Attack: a registration whose calibration carries a megabyte of fields unknown to the
// coordinator, kept in memory and in the state database for as long as the worker.
TEST_F(AdversaryBudgetTest, OversizedCalibrationIsRefused) {
  auto stub = v1::CoordinatorService::NewStub(Channel("worker-a"));
  v1::RegisterWorkerRequest req;
  req.set_name("worker-a");
  req.set_slots(2);
  req.set_device("cpu");
  req.set_address("127.0.0.1");
  v1::HostCalibration* c = req.mutable_calibration();
  c->set_gemm_flops(1e12);
  c->GetReflection()->MutableUnknownFields(c)->AddLengthDelimited(77, std::string(1 << 20, 'c'));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  v1::RegisterWorkerResponse resp;
  grpc::Status s = stub->RegisterWorker(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(s.error_message().rfind("calibration: ", 0), 0u) << s.error_message();
  // The registration the worker had stays.
  grpc::ClientContext list_ctx;
  Authorize(&list_ctx);
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(client_->ListWorkers(&list_ctx, v1::ListWorkersRequest(), &workers).ok());
  ASSERT_EQ(workers.workers_size(), 1);
  EXPECT_LT(workers.workers(0).calibration().ByteSizeLong(), 1024u);
}

}  // namespace
}  // namespace meshrun
