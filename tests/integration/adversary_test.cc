// The attacks of the second security review, each performed as it was found: over gRPC against
// an in-process coordinator serving mutual TLS with tokens, by fake workers holding real
// worker certificates and by clients written against the protos. Each attack is refused or
// bounded with the error that names its limit, and the coordinator keeps serving with its
// state intact (docs/security.md "Limits"). Loopback only; every wait bounded; no assertion on
// elapsed time.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
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

constexpr char kAdversaryToken[] = "adversary-test-token";

bool Contains(const grpc::Status& s, const std::string& part) {
  return s.error_message().find(part) != std::string::npos;
}

class AdversaryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new testing::TestCerts();
    dir_ = new testing::TempDir();
    if (!certs_->Generate(fs::path(dir_->path()) / "certs", {"worker-a", "worker-b"})) {
      skip_ = certs_->error;
    }
  }
  static void TearDownTestSuite() {
    delete certs_;
    delete dir_;
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    token_file_ = (fs::path(state_.path()) / "tokens").string();
    std::ofstream(token_file_) << kAdversaryToken << "\nsecond-token\n";
  }

  // TLS with client certificates and tokens; `adjust` changes the limits first.
  void StartServer(const std::function<void(coordinator::CoordinatorConfig&)>& adjust = {}) {
    coordinator::CoordinatorConfig config = testing::MutualTlsConfig(
        *certs_, (fs::path(state_.path()) / "state").string(), token_file_);
    if (adjust) adjust(config);
    auto server = coordinator::CoordinatorServer::Start(config);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    address_ = "127.0.0.1:" + std::to_string(server_->port());
    client_ = v1::CoordinatorService::NewStub(Channel(""));
  }

  std::shared_ptr<grpc::Channel> Channel(const std::string& client) {
    return testing::MutualTlsChannel(*certs_, address_, client);
  }

  std::unique_ptr<testing::FakeGrpcWorker> Worker(const std::string& name, int slots) {
    return testing::RegisteredWorker(Channel(name), name, slots);
  }

  grpc::Status Submit(const v1::SubmitJobRequest& request, std::string* id = nullptr,
                      const std::string& authorization = std::string("Bearer ") + kAdversaryToken) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    ctx.AddMetadata("authorization", authorization);
    v1::SubmitJobResponse response;
    grpc::Status s = client_->SubmitJob(&ctx, request, &response);
    if (id != nullptr) *id = response.job_id();
    return s;
  }

  v1::Job GetJob(const std::string& id) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    ctx.AddMetadata("authorization", std::string("Bearer ") + kAdversaryToken);
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::GetJobResponse resp;
    grpc::Status s = client_->GetJob(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.job();
  }

  v1::GetJobLogsResponse Logs(const std::string& id) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    ctx.AddMetadata("authorization", std::string("Bearer ") + kAdversaryToken);
    v1::GetJobLogsRequest req;
    req.set_job_id(id);
    v1::GetJobLogsResponse resp;
    grpc::Status s = client_->GetJobLogs(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }

  // The coordinator still answers the client API.
  bool Serving() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    ctx.AddMetadata("authorization", std::string("Bearer ") + kAdversaryToken);
    v1::ListJobsResponse resp;
    return client_->ListJobs(&ctx, v1::ListJobsRequest(), &resp).ok();
  }

  // A job of one tp group of 2 placed on one of `a`/`b`; returns its assignments and sets the
  // owner and the other worker.
  std::vector<v1::RankAssignment> PlaceJob(testing::FakeGrpcWorker* a, testing::FakeGrpcWorker* b,
                                           std::string* id, testing::FakeGrpcWorker** owner,
                                           testing::FakeGrpcWorker** other) {
    EXPECT_TRUE(Submit(testing::SubmitRequest(1, 1, 1, 2), id).ok());
    std::vector<v1::RankAssignment> assigned = a->TakeAssignments(2, 5s);
    *owner = a;
    *other = b;
    if (assigned.empty()) {
      assigned = b->TakeAssignments(2, 5s);
      std::swap(*owner, *other);
    }
    return assigned;
  }

  static v1::WorkerSessionRequest LogBatch(const std::string& job, int attempt, int rank,
                                           const std::string& text, int lines) {
    v1::WorkerSessionRequest m;
    for (int i = 0; i < lines; ++i) {
      v1::LogLine* l = m.mutable_logs()->add_lines();
      l->set_job_id(job);
      l->set_attempt(attempt);
      l->set_rank(rank);
      l->set_text(text);
    }
    return m;
  }

  static testing::TestCerts* certs_;
  static testing::TempDir* dir_;
  static std::string skip_;
  testing::TempDir state_;
  std::string token_file_;
  std::unique_ptr<coordinator::CoordinatorServer> server_;
  std::string address_;
  std::unique_ptr<v1::CoordinatorService::Stub> client_;
};

testing::TestCerts* AdversaryTest::certs_ = nullptr;
testing::TempDir* AdversaryTest::dir_ = nullptr;
std::string AdversaryTest::skip_;

// Attack: a worker certificate injects 11,000 lines into a job placed only on another worker,
// under an attempt number the coordinator never ran, to push the real lines out.
TEST_F(AdversaryTest, ForgedLogLinesOfAnotherWorkersJobAreDropped) {
  StartServer();
  auto a = Worker("worker-a", 2);
  auto b = Worker("worker-b", 2);
  std::string job;
  testing::FakeGrpcWorker *owner = nullptr, *other = nullptr;
  std::vector<v1::RankAssignment> assigned = PlaceJob(a.get(), b.get(), &job, &owner, &other);
  ASSERT_EQ(assigned.size(), 2u);
  const int attempt = assigned[0].attempt();
  ASSERT_TRUE(owner->Started(assigned[0]));
  ASSERT_TRUE(owner->Send(LogBatch(job, attempt, 0, "real line", 1)));

  // The other worker, and the owner too, under a made-up attempt: 11 batches of 1,000.
  for (int i = 0; i < 11; ++i) {
    ASSERT_TRUE(other->Send(LogBatch(job, 77, 0, "\x1b]0;owned\x07 forged", 1000)));
  }
  ASSERT_TRUE(owner->Send(LogBatch(job, 77, 1, "forged by the owner", 5)));
  // The other worker about the real attempt: refused, its session ends.
  ASSERT_TRUE(other->Send(LogBatch(job, attempt, 0, "forged, real attempt", 1)));
  std::optional<grpc::Status> ended = other->WaitEnded(10s);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->error_code(), grpc::StatusCode::PERMISSION_DENIED) << ended->error_message();
  // A marker the owner sends last: once it is in, every earlier batch was handled.
  ASSERT_TRUE(owner->Send(LogBatch(job, attempt, 1, "marker", 1)));
  ASSERT_TRUE(testing::WaitFor([&] {
    const v1::GetJobLogsResponse logs = Logs(job);
    return logs.lines_size() > 0 && logs.lines(logs.lines_size() - 1).text() == "marker";
  }));
  const v1::GetJobLogsResponse logs = Logs(job);
  EXPECT_FALSE(logs.truncated());
  ASSERT_EQ(logs.lines_size(), 2);
  EXPECT_EQ(logs.lines(0).text(), "real line");
  EXPECT_EQ(logs.lines(1).text(), "marker");
  EXPECT_EQ(GetJob(job).state(), v1::JOB_STATE_RUNNING);
}

// Attack: one token, spelt with a different number of spaces each time, gets a fresh bucket per
// spelling; without the fix 100 jobs went through a burst of 20.
TEST_F(AdversaryTest, SubmitRateIsKeyedOnTheAcceptedTokenWhateverItsSpelling) {
  StartServer([](coordinator::CoordinatorConfig& c) {
    c.submit_rate = 0.001;  // one token per 1,000 s: only the burst goes through
    c.submit_burst = 5;
  });
  int accepted = 0, refused = 0;
  grpc::Status last;
  for (int i = 0; i < 30; ++i) {
    const std::string header = (i % 2 ? "bearer" : "Bearer") + std::string(1 + i, ' ') +
                               kAdversaryToken + std::string(i % 3, ' ');
    grpc::Status s = Submit(testing::SubmitRequest(1, 1, 1, 1), nullptr, header);
    if (s.ok()) {
      ++accepted;
    } else {
      ++refused;
      last = s;
      EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    }
  }
  EXPECT_EQ(accepted, 5);
  EXPECT_EQ(refused, 25);
  EXPECT_TRUE(Contains(last, "--submit-rate: ")) << last.error_message();
  // Another accepted token is another caller.
  EXPECT_TRUE(Submit(testing::SubmitRequest(1, 1, 1, 1), nullptr, "Bearer second-token").ok());
  EXPECT_TRUE(Serving());
}

// Attack: one submission asks for a million restarts.
TEST_F(AdversaryTest, MaxRestartsOverTheBoundIsRefused) {
  StartServer();
  grpc::Status s = Submit(testing::SubmitRequest(1, 1, 1, 1, /*max_restarts=*/1000000));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(s.error_message().rfind("restart.max_restarts: 1000000 is over the limit of 100", 0),
            0u)
      << s.error_message();
  EXPECT_TRUE(Contains(s, "(hint: ")) << s.error_message();
  EXPECT_TRUE(Submit(testing::SubmitRequest(1, 1, 1, 1, 100)).ok());
}

// Attack: a compromised worker lists 100,000 made-up ranks per heartbeat, each asking for a
// StopOrder and a bookkeeping entry.
TEST_F(AdversaryTest, HeartbeatsNamingMadeUpRanksAreBounded) {
  StartServer([](coordinator::CoordinatorConfig& c) {
    c.max_ranks_per_report = 64;
    c.max_stops_per_worker = 16;
  });
  auto a = Worker("worker-a", 2);
  auto b = Worker("worker-b", 2);
  std::string job;
  testing::FakeGrpcWorker *owner = nullptr, *other = nullptr;
  std::vector<v1::RankAssignment> assigned = PlaceJob(a.get(), b.get(), &job, &owner, &other);
  ASSERT_EQ(assigned.size(), 2u);
  for (const auto& r : assigned) ASSERT_TRUE(owner->Started(r));

  auto fake_ranks = [](int n, int first) {
    std::vector<v1::RunningRank> out;
    for (int i = 0; i < n; ++i) {
      v1::RunningRank r;
      r.set_job_id("job-fake-" + std::to_string(first + i));
      r.set_attempt(1);
      r.set_rank(0);
      out.push_back(r);
    }
    return out;
  };
  // 100,000 ranks in one heartbeat: over --max-ranks-per-report.
  ASSERT_TRUE(other->Heartbeat(fake_ranks(100000, 0)));
  std::optional<grpc::Status> ended = other->WaitEnded(10s);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << ended->error_message();
  EXPECT_EQ(
      ended->error_message().rfind("--max-ranks-per-report: heartbeat.running lists 100000", 0), 0u)
      << ended->error_message();

  // Under that limit, but more unknown attempts than --max-stops-per-worker: 10 are stopped,
  // the next 10 would pass 16.
  other->Open();
  ASSERT_TRUE(other->WaitAccepted());
  ASSERT_TRUE(other->Heartbeat(fake_ranks(10, 0)));
  EXPECT_EQ(other->TakeStops(10, 10s).size(), 10u);
  ASSERT_TRUE(other->Heartbeat(fake_ranks(10, 10)));
  ended = other->WaitEnded(10s);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << ended->error_message();
  EXPECT_TRUE(Contains(*ended, "--max-stops-per-worker: ")) << ended->error_message();

  // The real job is untouched and the coordinator serves.
  EXPECT_TRUE(Serving());
  const v1::Job j = GetJob(job);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RUNNING);
  ASSERT_EQ(j.ranks_size(), 2);
  EXPECT_EQ(j.ranks(0).state(), v1::RANK_STATE_RUNNING);
}

// Attack: a token taken out of --token-file keeps a WatchJob stream it opened before.
TEST_F(AdversaryTest, RevokedTokenEndsItsOpenWatchStreams) {
  StartServer();
  std::string job;
  ASSERT_TRUE(Submit(testing::SubmitRequest(1, 1, 1, 1), &job).ok());  // PENDING: no workers
  auto watch = [&](const std::string& token, grpc::Status* out, std::atomic<int>* events) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 30s);
    ctx.AddMetadata("authorization", "Bearer " + token);
    v1::WatchJobRequest req;
    req.set_job_id(job);
    auto reader = client_->WatchJob(&ctx, req);
    v1::WatchJobResponse resp;
    while (reader->Read(&resp)) ++*events;
    *out = reader->Finish();
  };
  grpc::Status revoked_status, kept_status;
  std::atomic<int> revoked_events{0}, kept_events{0};
  std::thread revoked(watch, kAdversaryToken, &revoked_status, &revoked_events);
  std::thread kept(watch, "second-token", &kept_status, &kept_events);
  ASSERT_TRUE(testing::WaitFor([&] { return revoked_events > 0 && kept_events > 0; }));

  std::ofstream(token_file_, std::ios::trunc) << "second-token\n";
  ASSERT_TRUE(server_->ReloadTokens().ok());
  revoked.join();
  EXPECT_EQ(revoked_status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
      << revoked_status.error_message();
  EXPECT_TRUE(Contains(revoked_status, "authorization: ")) << revoked_status.error_message();
  // The stream of the token still accepted stays open until its job ends.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  ctx.AddMetadata("authorization", "Bearer second-token");
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job);
  v1::CancelJobResponse cancelled;
  ASSERT_TRUE(client_->CancelJob(&ctx, cancel, &cancelled).ok());
  kept.join();
  EXPECT_TRUE(kept_status.ok()) << kept_status.error_message();
}

// The state database holds worker session tokens and specs: owner-only.
TEST_F(AdversaryTest, StateDatabaseIsOwnerOnly) {
  const mode_t old = ::umask(022);
  StartServer();
  ::umask(old);
  for (const char* name : {"coordinator.db", "coordinator.db-wal", "coordinator.db-shm"}) {
    const fs::path p = fs::path(state_.path()) / "state" / name;
    if (!fs::exists(p)) continue;
    EXPECT_EQ(fs::status(p).permissions() & fs::perms::all,
              fs::perms::owner_read | fs::perms::owner_write)
        << p;
  }
}

}  // namespace
}  // namespace meshrun
