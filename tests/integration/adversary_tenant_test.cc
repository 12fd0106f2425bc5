// The attacks of the third security review on shared limits, each performed as it was found:
// one bearer token or one worker certificate filling a limit that every caller shares, cancelled
// calls keeping their slots, idle connections deafening the coordinator, idle HTTP connections
// blocking /metrics. Against an in-process coordinator serving mutual TLS with tokens, and for
// the descriptor flood against the real meshrun-coordinator under a lowered open-files limit
// (prlimit). Loopback only; every wait bounded; no assertion on elapsed time beyond the
// deadlines of the calls themselves.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/tls.h"
#include "coordinator/server.h"
#include "coordinator/store_manager.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "tests/coordinator/test_util.h"
#include "tests/fakes/fake_grpc_worker.h"
#include "tests/integration/daemons.h"
#include "tests/integration/mutual_tls_coordinator.h"
#include "tests/integration/test_certs.h"
#include "worker/worker_metrics.h"

namespace meshrun {
namespace {
// Its own namespace: the group's unity batches put this file beside adversary_test.cc.
namespace tenant_attacks {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr char kTokenA[] = "tenant-a-token";
constexpr char kTokenB[] = "tenant-b-token";

std::string Bearer(const char* token) {
  return std::string("Bearer ") + token;
}

bool Mentions(const grpc::Status& s, const std::string& part) {
  return s.error_message().find(part) != std::string::npos;
}

// This process's resident set, in bytes (VmRSS of /proc/self/status).
size_t ResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// A TCP connection to 127.0.0.1:port that sends nothing; -1 when it could not be made.
int IdleConnection(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval tv{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// GET /metrics over a fresh connection; the body, or "" when no complete answer came within
// `timeout`.
std::string Scrape(int port, std::chrono::seconds timeout) {
  const int fd = IdleConnection(port);
  if (fd < 0) return "";
  timeval tv{static_cast<time_t>(timeout.count()), 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const std::string request =
      "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  std::string answer;
  char buf[65536];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    answer.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return answer;
}

class TenantTest : public ::testing::Test {
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
    std::ofstream(token_file_) << kTokenA << "\n" << kTokenB << "\n";
  }

  // TLS with client certificates and the two tokens; `adjust` changes the limits first.
  void StartServer(const std::function<void(coordinator::CoordinatorConfig&)>& adjust = {}) {
    coordinator::CoordinatorConfig config = testing::MutualTlsConfig(
        *certs_, (fs::path(state_.path()) / "state").string(), token_file_);
    config.submit_rate = 0;
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

  grpc::Status Submit(const char* token, std::string* id = nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    ctx.AddMetadata("authorization", Bearer(token));
    v1::SubmitJobResponse response;
    grpc::Status s = client_->SubmitJob(&ctx, testing::SubmitRequest(1, 1, 1, 2), &response);
    if (id != nullptr) *id = response.job_id();
    return s;
  }

  // One open WatchJob stream of `token` on `job`: open once its first (replayed) event came.
  struct Watch {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientReader<v1::WatchJobResponse>> reader;
    bool open = false;
    grpc::Status ended;
  };
  Watch OpenWatch(const char* token, const std::string& job) {
    Watch w;
    w.ctx = std::make_unique<grpc::ClientContext>();
    w.ctx->set_deadline(std::chrono::system_clock::now() + 60s);
    w.ctx->AddMetadata("authorization", Bearer(token));
    v1::WatchJobRequest request;
    request.set_job_id(job);
    w.reader = client_->WatchJob(w.ctx.get(), request);
    v1::WatchJobResponse event;
    w.open = w.reader->Read(&event);
    if (!w.open) w.ended = w.reader->Finish();
    return w;
  }
  static void Cancel(Watch& w) {
    if (!w.open) return;
    w.ctx->TryCancel();
    w.ended = w.reader->Finish();
    w.open = false;
  }

  // A job of one tp group of 2 on one of the workers; returns its attempt and the worker.
  int PlaceJob(testing::FakeGrpcWorker* a, testing::FakeGrpcWorker* b, std::string* id,
               testing::FakeGrpcWorker** owner) {
    EXPECT_TRUE(Submit(kTokenA, id).ok());
    std::vector<v1::RankAssignment> assigned = a->TakeAssignments(2, 5s);
    *owner = a;
    if (assigned.empty()) {
      assigned = b->TakeAssignments(2, 5s);
      *owner = b;
    }
    EXPECT_EQ(assigned.size(), 2u);
    return assigned.empty() ? 0 : assigned[0].attempt();
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

testing::TestCerts* TenantTest::certs_ = nullptr;
testing::TempDir* TenantTest::dir_ = nullptr;
std::string TenantTest::skip_;

// Attack: 1,024 WatchJob streams on a PENDING job, then cancelled. Before the fix the job kept
// them as watchers until its next event, so every other user's --follow was refused.
TEST_F(TenantTest, CancelledWatchStreamsFreeTheirSlotsAtOnce) {
  StartServer([](coordinator::CoordinatorConfig& c) {
    c.max_watch_streams = 1024;
    c.max_watch_streams_per_caller = 1024;
  });
  std::string job;
  ASSERT_TRUE(Submit(kTokenA, &job).ok());  // no workers: it stays PENDING, without events

  std::vector<Watch> watches;
  for (int i = 0; i < 1024; ++i) {
    watches.push_back(OpenWatch(kTokenA, job));
    ASSERT_TRUE(watches.back().open) << i << ": " << watches.back().ended.error_message();
  }
  Watch over = OpenWatch(kTokenB, job);
  ASSERT_FALSE(over.open);
  EXPECT_EQ(over.ended.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(Mentions(over.ended, "--max-watch-streams: ")) << over.ended.error_message();

  for (Watch& w : watches) Cancel(w);
  // The coordinator learns of each cancellation from gRPC, not from the job's next event.
  ASSERT_TRUE(testing::WaitFor([&] { return server_->watch_streams() == 0; }, 10s))
      << server_->watch_streams() << " streams still counted";
  Watch follow = OpenWatch(kTokenB, job);
  EXPECT_TRUE(follow.open) << follow.ended.error_message();
  Cancel(follow);
}

// Attack: one token opens WatchJob streams and submits PENDING jobs until refused. Before the
// fix both limits were cluster-wide: the token took every slot and the other token was refused.
TEST_F(TenantTest, OneTokenFillingItsQuotasDoesNotStopAnother) {
  StartServer([](coordinator::CoordinatorConfig& c) {
    c.max_watch_streams = 64;
    c.max_watch_streams_per_caller = 8;
    c.max_pending_jobs = 40;
    c.max_pending_jobs_per_caller = 5;
  });
  std::string job;
  ASSERT_TRUE(Submit(kTokenA, &job).ok());

  std::vector<Watch> watches;
  grpc::Status refused;
  for (int i = 0; i < 65; ++i) {
    Watch w = OpenWatch(kTokenA, job);
    if (!w.open) {
      refused = w.ended;
      break;
    }
    watches.push_back(std::move(w));
  }
  EXPECT_EQ(watches.size(), 8u);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(Mentions(refused, "--max-watch-streams-per-caller: ")) << refused.error_message();
  Watch other = OpenWatch(kTokenB, job);
  EXPECT_TRUE(other.open) << other.ended.error_message();
  Cancel(other);
  for (Watch& w : watches) Cancel(w);

  int accepted = 1;  // the job above
  grpc::Status last;
  for (int i = 0; i < 40; ++i) {
    last = Submit(kTokenA);
    if (!last.ok()) break;
    ++accepted;
  }
  EXPECT_EQ(accepted, 5);
  EXPECT_EQ(last.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(Mentions(last, "--max-pending-jobs-per-caller: ")) << last.error_message();
  std::string b_job;
  grpc::Status b = Submit(kTokenB, &b_job);
  EXPECT_TRUE(b.ok()) << b.error_message();
  // Cancelling one of its jobs gives the token a slot back.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  ctx.AddMetadata("authorization", Bearer(kTokenA));
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job);
  v1::CancelJobResponse cancelled;
  ASSERT_TRUE(client_->CancelJob(&ctx, cancel, &cancelled).ok());
  EXPECT_TRUE(Submit(kTokenA).ok());
}

// Attack: a worker certificate parks StoreGet waits (4 KiB keys nobody sets) on its own job
// until refused. Before the fix the 65,536 waits were shared by every job: another job's
// rendezvous then failed at once, the coordinator's memory grew by a gigabyte, and cancelled
// waits stayed parked until their (client-chosen) timeout.
TEST_F(TenantTest, StoreWaitsOfOneWorkerDoNotStopAnotherJobsRendezvous) {
  StartServer([](coordinator::CoordinatorConfig& c) {
    c.max_store_waits = 1200;  // the per-worker limit keeps its default, 1,024
  });
  auto a = Worker("worker-a", 2);
  auto b = Worker("worker-b", 2);
  std::string attacked_job, victim_job;
  testing::FakeGrpcWorker *attacker = nullptr, *victim = nullptr;
  const int attacked_attempt = PlaceJob(a.get(), b.get(), &attacked_job, &attacker);
  ASSERT_GT(attacked_attempt, 0);
  const int victim_attempt = PlaceJob(a.get(), b.get(), &victim_job, &victim);
  ASSERT_GT(victim_attempt, 0);
  ASSERT_NE(attacker, victim);
  const std::string attacker_name = attacker == a.get() ? "worker-a" : "worker-b";
  const std::string victim_name = attacker == a.get() ? "worker-b" : "worker-a";

  const size_t baseline = ResidentBytes();
  auto stub = v1::CoordinatorService::NewStub(Channel(attacker_name));
  constexpr int kCalls = 1200;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts(kCalls);
  std::vector<v1::StoreGetRequest> requests(kCalls);
  std::vector<v1::StoreGetResponse> responses(kCalls);
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0, exhausted = 0, cancelled = 0;
  std::string refusal;
  for (int i = 0; i < kCalls; ++i) {
    contexts[i] = std::make_unique<grpc::ClientContext>();
    contexts[i]->set_deadline(std::chrono::system_clock::now() + 120s);
    requests[i].set_job_id(attacked_job);
    requests[i].set_attempt(attacked_attempt);
    requests[i].set_key(std::to_string(i) + std::string(4000, 'k'));
    requests[i].set_wait(true);
    requests[i].mutable_timeout()->set_seconds(864000);  // ten days
    stub->async()->StoreGet(contexts[i].get(), &requests[i], &responses[i], [&](grpc::Status s) {
      std::lock_guard<std::mutex> lock(mu);
      ++finished;
      if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
        ++exhausted;
        refusal = s.error_message();
      }
      if (s.error_code() == grpc::StatusCode::CANCELLED) ++cancelled;
      cv.notify_all();
    });
  }
  coordinator::StoreManager& store = server_->store();
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return store.waiter_count() + static_cast<size_t>(exhausted) == kCalls;
      },
      30s))
      << store.waiter_count() << " waiting, " << exhausted << " refused";
  EXPECT_EQ(store.waiter_count(), 1024u);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(exhausted, kCalls - 1024);
    EXPECT_NE(refusal.find("--max-store-waits-per-worker: "), std::string::npos) << refusal;
  }
  const size_t parked = ResidentBytes();
  EXPECT_LT(parked, baseline + (100u << 20)) << "RSS " << baseline << " -> " << parked;

  // The other job's rendezvous: a wait, then the key set by its peer.
  auto victim_stub = v1::CoordinatorService::NewStub(Channel(victim_name));
  grpc::ClientContext wait_ctx;
  wait_ctx.set_deadline(std::chrono::system_clock::now() + 20s);
  v1::StoreGetRequest wait;
  wait.set_job_id(victim_job);
  wait.set_attempt(victim_attempt);
  wait.set_key("MASTER_ADDR");
  wait.set_wait(true);
  v1::StoreGetResponse got;
  std::atomic<bool> got_done{false};
  grpc::Status got_status;
  victim_stub->async()->StoreGet(&wait_ctx, &wait, &got, [&](grpc::Status s) {
    got_status = s;
    got_done = true;
  });
  ASSERT_TRUE(testing::WaitFor([&] { return store.waiter_count() == 1025 || got_done; }, 10s));
  grpc::ClientContext set_ctx;
  set_ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  v1::StoreSetRequest set;
  set.set_job_id(victim_job);
  set.set_attempt(victim_attempt);
  set.set_key("MASTER_ADDR");
  set.set_value("10.0.0.1:29500");
  v1::StoreSetResponse set_resp;
  grpc::Status set_status = victim_stub->StoreSet(&set_ctx, set, &set_resp);
  EXPECT_TRUE(set_status.ok()) << set_status.error_message();
  ASSERT_TRUE(testing::WaitFor([&] { return got_done.load(); }, 20s));
  EXPECT_TRUE(got_status.ok()) << got_status.error_message();
  EXPECT_EQ(got.value(), "10.0.0.1:29500");

  // The attacker goes away: its waits are dropped at once, not at their timeout.
  for (auto& ctx : contexts) ctx->TryCancel();
  EXPECT_TRUE(testing::WaitFor([&] { return store.waiter_count() == 0; }, 10s))
      << store.waiter_count() << " waits still parked";
  std::unique_lock<std::mutex> lock(mu);
  EXPECT_TRUE(cv.wait_for(lock, 20s, [&] { return finished == kCalls; }));
}

// Attack: a StoreGet that asks to wait ten days. The coordinator clamps it to --max-store-wait.
TEST_F(TenantTest, StoreWaitTimeoutIsClamped) {
  StartServer([](coordinator::CoordinatorConfig& c) { c.max_store_wait = 1s; });
  auto a = Worker("worker-a", 2);
  auto b = Worker("worker-b", 2);
  std::string job;
  testing::FakeGrpcWorker* owner = nullptr;
  const int attempt = PlaceJob(a.get(), b.get(), &job, &owner);
  ASSERT_GT(attempt, 0);
  auto stub = v1::CoordinatorService::NewStub(Channel(owner == a.get() ? "worker-a" : "worker-b"));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 30s);
  v1::StoreGetRequest get;
  get.set_job_id(job);
  get.set_attempt(attempt);
  get.set_key("never-set");
  get.set_wait(true);
  get.mutable_timeout()->set_seconds(864000);
  v1::StoreGetResponse resp;
  grpc::Status s = stub->StoreGet(&ctx, get, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The coordinator's own answer, not the client's 30 s deadline.
  EXPECT_TRUE(Mentions(s, "store: the key was not set before the wait ran out"))
      << s.error_message();
  EXPECT_EQ(server_->store().waiter_count(), 0u);
}

// Attack: idle HTTP connections to /metrics. Before the fix the exporter's two threads each sat
// on one for 30 s and every scrape waited.
TEST_F(TenantTest, IdleHttpConnectionsDoNotBlockAScrape) {
  StartServer([](coordinator::CoordinatorConfig& c) { c.metrics_listen = "127.0.0.1:0"; });
  const int port = server_->metrics_port();
  ASSERT_GT(port, 0);
  std::vector<int> idle;
  for (int i = 0; i < 8; ++i) {
    const int fd = IdleConnection(port);
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  std::this_thread::sleep_for(200ms);  // let the server hand them to its threads
  const std::string answer = Scrape(port, 10s);
  EXPECT_NE(answer.find("200 OK"), std::string::npos) << answer.substr(0, 200);
  EXPECT_NE(answer.find("meshrun_"), std::string::npos);
  for (int fd : idle) close(fd);
}

// The same against a worker's /metrics (the same server options).
TEST(TenantMetricsTest, IdleHttpConnectionsDoNotBlockAWorkerScrape) {
  auto metrics = WorkerMetrics::Create("127.0.0.1:0", "worker-idle", 2);
  ASSERT_TRUE(metrics.ok()) << metrics.status().ToString();
  const int port = (*metrics)->port();
  ASSERT_GT(port, 0);
  std::vector<int> idle;
  for (int i = 0; i < 8; ++i) {
    const int fd = IdleConnection(port);
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  std::this_thread::sleep_for(200ms);
  const std::string answer = Scrape(port, 10s);
  EXPECT_NE(answer.find("200 OK"), std::string::npos) << answer.substr(0, 200);
  EXPECT_NE(answer.find("meshrun_worker_slots"), std::string::npos);
  for (int fd : idle) close(fd);
}

// The done-criterion of the descriptor flood, against the real binary: with RLIMIT_NOFILE 256
// (soft and hard, so the coordinator cannot raise it), 1,000 idle connections. Before the fix
// accept4 failed with EMFILE and libgrpc 1.51 closed its listener for good: the coordinator
// stayed deaf after the flood ended. Now it answers while the flood is open (the idle
// connections are closed after --handshake-timeout, the excess at once) and after it ends.
TEST(TenantFloodTest, DescriptorFloodDoesNotDeafenTheCoordinator) {
  const fs::path bin = testing::BinDir() / "meshrun-coordinator";
  if (!fs::exists(bin)) GTEST_SKIP() << bin << " not built";
  if (!fs::exists("/usr/bin/prlimit")) GTEST_SKIP() << "no /usr/bin/prlimit";
  // This process needs descriptors for its 1,000 sockets.
  rlimit mine{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &mine), 0);
  if (mine.rlim_max < 1500) GTEST_SKIP() << "open-files hard limit " << mine.rlim_max;
  const rlim_t saved = mine.rlim_cur;
  mine.rlim_cur = mine.rlim_max;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &mine), 0);

  testing::TempDir dir;
  const int port = testing::FreePort();
  const fs::path log = fs::path(dir.path()) / "coordinator.log";
  testing::Daemon coordinator =
      testing::Spawn("coordinator",
                     {"/usr/bin/prlimit", "--nofile=256:256", "--", bin.string(), "--listen",
                      "127.0.0.1:" + std::to_string(port), "--state-dir",
                      (fs::path(dir.path()) / "s").string(), "--handshake-timeout", "2"},
                     log);
  auto list_jobs = [&](std::chrono::seconds deadline) {
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                       grpc::InsecureChannelCredentials());
    auto stub = v1::CoordinatorService::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + deadline);
    ctx.set_wait_for_ready(true);
    v1::ListJobsResponse resp;
    return stub->ListJobs(&ctx, v1::ListJobsRequest(), &resp);
  };
  auto log_text = [&] {
    std::ifstream in(log);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  grpc::Status up = list_jobs(20s);
  ASSERT_TRUE(up.ok()) << up.error_message() << "\n" << log_text();

  std::vector<int> flood;
  for (int i = 0; i < 1000; ++i) {
    const int fd = IdleConnection(port);
    if (fd >= 0) flood.push_back(fd);
  }
  EXPECT_GT(flood.size(), 256u);
  // While the flood is open.
  grpc::Status during = list_jobs(30s);
  EXPECT_TRUE(during.ok()) << during.error_message();
  for (int fd : flood) close(fd);
  // After it: within the brief's 5 s.
  grpc::Status after = list_jobs(5s);
  EXPECT_TRUE(after.ok()) << after.error_message();
  const std::string text = log_text();
  EXPECT_NE(text.find("open files: 256 (already the hard limit)"), std::string::npos) << text;
  EXPECT_EQ(text.find("Failed accept4"), std::string::npos) << text;
  testing::Stop(coordinator);
  mine.rlim_cur = saved;
  setrlimit(RLIMIT_NOFILE, &mine);
}

}  // namespace tenant_attacks
}  // namespace
}  // namespace meshrun
