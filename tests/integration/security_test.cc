// TLS, mutual TLS, bearer tokens and per-worker authorisation (docs/security.md), with
// certificates made by openssl at test time. An in-process coordinator serving TLS with tokens
// is driven by gRPC clients and fake workers holding different certificates; then the binaries:
// insecure starts refused with exit 2, and a real job run end to end over mutual TLS with a
// token (coordinator, one worker, `meshrun submit --follow`). Loopback only; every wait bounded.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "client/coordinator_client.h"
#include "common/tls.h"
#include "coordinator/server.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "tests/client/cli_runner.h"
#include "tests/coordinator/test_util.h"
#include "tests/fakes/fake_grpc_worker.h"
#include "tests/integration/daemons.h"
#include "tests/integration/test_certs.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

constexpr char kToken[] = "s3cret-token-for-tests";
using testing::kCorpus;

using testing::BinDir;
using testing::FreePort;

// Shared by every test: one set of certificates per process.
class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new testing::TestCerts();
    dir_ = new testing::TempDir();
    if (!certs_->Generate(fs::path(dir_->path()) / "certs", {"worker-a", "worker-b"})) {
      skip_ = certs_->error;
    }
    std::ofstream(fs::path(dir_->path()) / "tokens")
        << "# accepted client tokens\n\nanother-token\n  " << kToken << "  \n";
  }
  static void TearDownTestSuite() {
    delete certs_;
    delete dir_;
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
  }

  static std::string TokenFile() { return (fs::path(dir_->path()) / "tokens").string(); }

  // The in-process coordinator: TLS with client certificates, tokens from TokenFile().
  void StartServer(const std::string& token_file = TokenFile()) {
    coordinator::CoordinatorConfig config;
    config.listen = "127.0.0.1:0";
    config.state_dir = state_.path();
    config.heartbeat_timeout = 30s;
    config.tls.cert = certs_->cert("coordinator");
    config.tls.key = certs_->key("coordinator");
    config.tls.ca = certs_->ca();
    config.token_file = token_file;
    auto server = coordinator::CoordinatorServer::Start(config);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    address_ = "127.0.0.1:" + std::to_string(server_->port());
  }

  // A channel verifying the server against `ca` and presenting `client`'s certificate (none
  // when empty).
  std::shared_ptr<grpc::Channel> Channel(const std::string& client, const std::string& ca = "ca") {
    TlsFiles files;
    files.ca = certs_->cert(ca);
    if (!client.empty()) {
      files.cert = certs_->cert(client);
      files.key = certs_->key(client);
    }
    StatusOr<TlsMaterial> material = LoadTls(files, false, true);
    EXPECT_TRUE(material.ok()) << material.status().ToString();
    return grpc::CreateChannel(address_, ChannelCredentials(&*material));
  }

  static void Authorize(grpc::ClientContext* ctx, const std::string& token) {
    ctx->AddMetadata("authorization", "Bearer " + token);
  }

  static grpc::Status ListWorkers(v1::CoordinatorService::Stub& stub, const std::string& token) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    if (!token.empty()) Authorize(&ctx, token);
    v1::ListWorkersResponse response;
    return stub.ListWorkers(&ctx, v1::ListWorkersRequest(), &response);
  }

  std::unique_ptr<testing::FakeGrpcWorker> Worker(const std::string& name, int slots) {
    auto w = std::make_unique<testing::FakeGrpcWorker>(Channel(name), name, slots);
    grpc::Status s = w->Register();
    EXPECT_TRUE(s.ok()) << s.error_message();
    w->Open();
    EXPECT_TRUE(w->WaitAccepted());
    return w;
  }

  std::string Submit(const v1::SubmitJobRequest& request) {
    auto stub = v1::CoordinatorService::NewStub(Channel(""));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    Authorize(&ctx, kToken);
    v1::SubmitJobResponse response;
    grpc::Status s = stub->SubmitJob(&ctx, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.job_id();
  }

  static testing::TestCerts* certs_;
  static testing::TempDir* dir_;
  static std::string skip_;
  testing::TempDir state_;
  std::unique_ptr<coordinator::CoordinatorServer> server_;
  std::string address_;
};

testing::TestCerts* SecurityTest::certs_ = nullptr;
testing::TempDir* SecurityTest::dir_ = nullptr;
std::string SecurityTest::skip_;

TEST_F(SecurityTest, ClientApiNeedsAnAcceptedBearerToken) {
  StartServer();
  auto stub = v1::CoordinatorService::NewStub(Channel(""));

  grpc::Status none = ListWorkers(*stub, "");
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(none.error_message().find("MESHRUN_TOKEN"), std::string::npos) << none.error_message();
  grpc::Status wrong = ListWorkers(*stub, "s3cret-token-for-tesTs");
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(wrong.error_message().find("not accepted"), std::string::npos);
  EXPECT_TRUE(ListWorkers(*stub, kToken).ok());
  EXPECT_TRUE(ListWorkers(*stub, "another-token").ok());

  // Every client RPC, WatchJob's stream included.
  {
    grpc::ClientContext ctx;
    v1::SubmitJobResponse response;
    EXPECT_EQ(stub->SubmitJob(&ctx, testing::SubmitRequest(1, 1, 1, 1), &response).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    v1::WatchJobRequest request;
    request.set_job_id("job-1");
    auto reader = stub->WatchJob(&ctx, request);
    v1::WatchJobResponse event;
    EXPECT_FALSE(reader->Read(&event));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  // A worker certificate is no substitute for the token.
  auto worker_stub = v1::CoordinatorService::NewStub(Channel("worker-a"));
  EXPECT_EQ(ListWorkers(*worker_stub, "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(SecurityTest, CoordinatorClientConnectsWithCaAndTokenFile) {
  StartServer();
  client::ConnectionFlags flags;
  flags.tls_ca = certs_->ca();
  flags.token_file = TokenFile();  // its first token: "another-token"
  auto client = client::CoordinatorClient::Connect(address_, flags);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_TRUE((*client)->ListWorkers().ok());

  flags.token_file.clear();
  auto tokenless = client::CoordinatorClient::Connect(address_, flags);
  ASSERT_TRUE(tokenless.ok());
  StatusOr<std::vector<v1::WorkerInfo>> refused = (*tokenless)->ListWorkers();
  EXPECT_EQ(refused.status().code(), StatusCode::kUnauthenticated) << refused.status().ToString();
}

TEST_F(SecurityTest, WrongCaFailsWithAClearClientError) {
  StartServer();
  client::ConnectionFlags flags;
  flags.tls_ca = certs_->cert("other-ca");
  flags.token_file = TokenFile();
  auto client = client::CoordinatorClient::Connect(address_, flags);
  ASSERT_TRUE(client.ok());
  StatusOr<std::vector<v1::WorkerInfo>> r = (*client)->ListWorkers();
  ASSERT_FALSE(r.ok());
  const std::string message = r.status().message();
  EXPECT_EQ(message.rfind("--tls-ca: the TLS handshake with the coordinator at " + address_, 0), 0u)
      << message;
  EXPECT_NE(message.find("certificate verify failed"), std::string::npos) << message;

  // Plaintext against the TLS port fails too, with a hint at --tls-ca.
  client::ConnectionFlags plain;
  plain.token_file = TokenFile();
  auto plain_client = client::CoordinatorClient::Connect(address_, plain);
  ASSERT_TRUE(plain_client.ok());
  StatusOr<std::vector<v1::WorkerInfo>> p = (*plain_client)->ListWorkers();
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("--tls-ca"), std::string::npos) << p.status().message();
}

TEST_F(SecurityTest, WorkerRegistersOverMutualTlsAsItsCertificateName) {
  StartServer();
  auto a = Worker("worker-a", 2);
  auto stub = v1::CoordinatorService::NewStub(Channel(""));
  grpc::ClientContext ctx;
  Authorize(&ctx, kToken);
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(stub->ListWorkers(&ctx, v1::ListWorkersRequest(), &workers).ok());
  ASSERT_EQ(workers.workers_size(), 1);
  EXPECT_EQ(workers.workers(0).name(), "worker-a");

  // Worker A's certificate cannot register as B.
  testing::FakeGrpcWorker impostor(Channel("worker-a"), "worker-b", 2);
  grpc::Status as_b = impostor.Register();
  EXPECT_EQ(as_b.error_code(), grpc::StatusCode::PERMISSION_DENIED) << as_b.error_message();
  // No client certificate: no worker identity.
  testing::FakeGrpcWorker anonymous(Channel(""), "worker-a", 2);
  grpc::Status no_cert = anonymous.Register();
  EXPECT_EQ(no_cert.error_code(), grpc::StatusCode::UNAUTHENTICATED) << no_cert.error_message();
  // A certificate from another CA does not get through the handshake.
  testing::FakeGrpcWorker rogue(Channel("rogue"), "rogue", 2);
  grpc::Status other_ca = rogue.Register(3s);
  EXPECT_FALSE(other_ca.ok());
  EXPECT_NE(other_ca.error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(SecurityTest, WorkerReachesOnlyTheAttemptsPlacedOnIt) {
  StartServer();
  auto a = Worker("worker-a", 2);
  auto b = Worker("worker-b", 2);
  // One tp group of 2: both ranks on one worker.
  const std::string job = Submit(testing::SubmitRequest(1, 1, 1, 2));
  std::vector<v1::RankAssignment> assigned = a->TakeAssignments(2, 5s);
  testing::FakeGrpcWorker* owner = a.get();
  testing::FakeGrpcWorker* other = b.get();
  std::string owner_name = "worker-a", other_name = "worker-b";
  if (assigned.empty()) {
    assigned = b->TakeAssignments(2, 5s);
    std::swap(owner, other);
    std::swap(owner_name, other_name);
  }
  ASSERT_EQ(assigned.size(), 2u);
  const int attempt = assigned[0].attempt();

  auto store_call = [&](const std::string& cert, const std::string& key) {
    auto stub = v1::CoordinatorService::NewStub(Channel(cert));
    grpc::ClientContext set_ctx, get_ctx, add_ctx;
    for (auto* c : {&set_ctx, &get_ctx, &add_ctx}) {
      c->set_deadline(std::chrono::system_clock::now() + 10s);
    }
    v1::StoreSetRequest set;
    set.set_job_id(job);
    set.set_attempt(attempt);
    set.set_key(key);
    set.set_value("v");
    v1::StoreSetResponse set_response;
    v1::StoreGetRequest get;
    get.set_job_id(job);
    get.set_attempt(attempt);
    get.set_key(key);
    v1::StoreGetResponse get_response;
    v1::StoreAddRequest add;
    add.set_job_id(job);
    add.set_attempt(attempt);
    add.set_key(key + "-count");
    add.set_delta(1);
    v1::StoreAddResponse add_response;
    return std::vector<grpc::Status>{stub->StoreSet(&set_ctx, set, &set_response),
                                     stub->StoreGet(&get_ctx, get, &get_response),
                                     stub->StoreAdd(&add_ctx, add, &add_response)};
  };
  for (const grpc::Status& s : store_call(owner_name, "rendezvous")) {
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  for (const grpc::Status& s : store_call(other_name, "rendezvous")) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  }
  for (const grpc::Status& s : store_call("", "rendezvous")) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  }

  // The owner reports its ranks; the other worker cannot report about them.
  EXPECT_TRUE(owner->Started(assigned[0]));
  ASSERT_TRUE(other->Started(assigned[1]));
  std::optional<grpc::Status> ended = other->WaitEnded(10s);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->error_code(), grpc::StatusCode::PERMISSION_DENIED) << ended->error_message();

  // Nor open a session under the owner's worker id.
  v1::WorkerSessionRequest open;
  open.mutable_open()->set_worker_id(owner->worker_id());
  open.mutable_open()->set_session_token(owner->registration().session_token());
  auto stub = v1::CoordinatorService::NewStub(Channel(other_name));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  auto stream = stub->WorkerSession(&ctx);
  ASSERT_TRUE(stream->Write(open));
  stream->WritesDone();
  v1::WorkerSessionResponse response;
  while (stream->Read(&response)) {
  }
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(SecurityTest, ReloadedTokenFileReplacesTheTokens) {
  const fs::path file = fs::path(state_.path()) / "reloaded-tokens";
  std::ofstream(file) << kToken << "\n";
  StartServer(file.string());
  auto stub = v1::CoordinatorService::NewStub(Channel(""));
  ASSERT_TRUE(ListWorkers(*stub, kToken).ok());
  std::ofstream(file) << "rotated-token\n";
  ASSERT_TRUE(server_->ReloadTokens().ok());
  EXPECT_EQ(ListWorkers(*stub, kToken).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(ListWorkers(*stub, "rotated-token").ok());
  // An empty file is refused and the tokens in use stay.
  std::ofstream(file) << "# nothing\n";
  EXPECT_FALSE(server_->ReloadTokens().ok());
  EXPECT_TRUE(ListWorkers(*stub, "rotated-token").ok());
}

// ---- The binaries -------------------------------------------------------------------------

class SecurityBinaryTest : public SecurityTest {
 protected:
  void SetUp() override {
    SecurityTest::SetUp();
    if (IsSkipped()) return;
    for (const char* bin : {"meshrun", "meshrun-worker", "meshrun-coordinator"}) {
      if (!fs::exists(BinDir() / bin)) GTEST_SKIP() << (BinDir() / bin) << " is not built";
    }
  }
  testing::CliResult Run(const std::string& binary, const std::vector<std::string>& args,
                         int timeout_s = 20) {
    return testing::RunCli(BinDir() / binary, args, fs::path(work_.path()) / "err.txt", timeout_s);
  }
  testing::TempDir work_;
};

TEST_F(SecurityBinaryTest, InsecureStartsAreRefusedWithExit2) {
  const std::string state = (fs::path(work_.path()) / "state").string();
  testing::CliResult plain =
      Run("meshrun-coordinator", {"--listen", "0.0.0.0:7070", "--state-dir", state});
  EXPECT_EQ(plain.exit_code, 2);
  EXPECT_EQ(plain.err,
            "error: --listen: 0.0.0.0:7070 is not loopback and no TLS is configured (hint: pass "
            "--tls-cert, --tls-key and --tls-ca, or --insecure on a trusted network)\n");

  testing::CliResult no_tokens =
      Run("meshrun-coordinator", {"--listen", "0.0.0.0:7070", "--state-dir", state, "--tls-cert",
                                  certs_->cert("coordinator"), "--tls-key",
                                  certs_->key("coordinator"), "--tls-ca", certs_->ca()});
  EXPECT_EQ(no_tokens.exit_code, 2);
  EXPECT_EQ(no_tokens.err.rfind("error: --token-file: is required when --listen 0.0.0.0:7070", 0),
            0u)
      << no_tokens.err;

  testing::CliResult missing =
      Run("meshrun-coordinator",
          {"--listen", "127.0.0.1:0", "--state-dir", state, "--tls-cert", "/nonexistent/server.crt",
           "--tls-key", certs_->key("coordinator"), "--tls-ca", certs_->ca()});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_EQ(missing.err.rfind("error: --tls-cert: cannot read '/nonexistent/server.crt'", 0), 0u)
      << missing.err;

  testing::CliResult wrong_key =
      Run("meshrun-coordinator", {"--listen", "127.0.0.1:0", "--state-dir", state, "--tls-cert",
                                  certs_->cert("coordinator"), "--tls-key", certs_->key("worker-a"),
                                  "--tls-ca", certs_->ca()});
  EXPECT_EQ(wrong_key.exit_code, 2);
  EXPECT_EQ(wrong_key.err.rfind("error: --tls-key: ", 0), 0u) << wrong_key.err;

  testing::CliResult worker =
      Run("meshrun-worker", {"--coordinator", "10.0.0.1:7070", "--name", "w", "--slots", "1",
                             "--work-dir", (fs::path(work_.path()) / "w").string()});
  EXPECT_EQ(worker.exit_code, 2);
  EXPECT_NE(worker.err.find("error: --coordinator: 10.0.0.1:7070 is not loopback and no TLS"),
            std::string::npos)
      << worker.err;

  testing::CliResult client = Run("meshrun", {"workers", "--coordinator", "10.0.0.1:7070"});
  EXPECT_EQ(client.exit_code, 2);
  EXPECT_NE(client.err.find("--coordinator: 10.0.0.1:7070 is not loopback"), std::string::npos)
      << client.err;
}

// A daemon started by the test; SIGKILLed when the test process dies.
pid_t Spawn(const std::vector<std::string>& argv, const fs::path& log) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

void Stop(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  for (int i = 0; i < 500; ++i) {
    if (waitpid(pid, nullptr, WNOHANG) == pid) return;
    std::this_thread::sleep_for(20ms);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

TEST_F(SecurityBinaryTest, JobRunsEndToEndOverMutualTlsWithATokenFile) {
  if (!fs::exists(kCorpus)) GTEST_SKIP() << kCorpus << " is missing (apt-get install fortunes)";
  const fs::path dir = work_.path();
  const std::string address = "127.0.0.1:" + std::to_string(FreePort());
  const pid_t coordinator =
      Spawn({(BinDir() / "meshrun-coordinator").string(), "--listen", address, "--state-dir",
             (dir / "state").string(), "--tls-cert", certs_->cert("coordinator"), "--tls-key",
             certs_->key("coordinator"), "--tls-ca", certs_->ca(), "--token-file", TokenFile()},
            dir / "coordinator.log");
  const pid_t worker =
      Spawn({(BinDir() / "meshrun-worker").string(), "--coordinator", address, "--name", "worker-a",
             "--slots", "2", "--work-dir", (dir / "work").string(), "--cores", "1", "--grace", "2",
             "--tls-cert", certs_->cert("worker-a"), "--tls-key", certs_->key("worker-a"),
             "--tls-ca", certs_->ca()},
            dir / "worker.log");
  const std::vector<std::string> secure = {"--coordinator", address,        "--tls-ca",
                                           certs_->ca(),    "--token-file", TokenFile()};
  auto cli = [&](std::vector<std::string> args, int timeout_s = 20) {
    args.insert(args.end(), secure.begin(), secure.end());
    return Run("meshrun", args, timeout_s);
  };
  bool ready = false;
  for (int i = 0; i < 150 && !ready; ++i) {
    testing::CliResult r = cli({"workers", "-o", "json"}, 5);
    if (r.exit_code == 0) {
      json workers = json::parse(r.out, nullptr, false);
      ready = workers.is_array() && workers.size() == 1 && workers[0]["state"] == "READY";
    }
    if (!ready) std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(ready) << testing::ReadFile(dir / "coordinator.log")
                     << testing::ReadFile(dir / "worker.log");

  const fs::path spec = dir / "job.yaml";
  std::ofstream(spec)
      << "name: tls-e2e\n"
         "model: {arch: gpt2, n_layer: 1, n_head: 2, d_model: 32, seq_len: 32, vocab_size: 256}\n"
         "parallelism: {dp_replicate_size: 1, dp_shard_size: 1, cp_size: 1, tp_size: 2}\n"
         "train: {steps: 3, global_batch_size: 4, micro_batch_size: 2, lr: 1.0e-3, "
         "warmup_steps: 1, seed: 7}\n"
         "data: {train: "
      << kCorpus << ", format: text}\n";
  testing::CliResult follow = cli({"submit", "-f", spec.string(), "--follow"}, 90);
  EXPECT_EQ(follow.exit_code, 0) << follow.out << follow.err
                                 << testing::ReadFile(dir / "coordinator.log")
                                 << testing::ReadFile(dir / "worker.log");
  testing::CliResult jobs = cli({"jobs", "-o", "json"});
  ASSERT_EQ(jobs.exit_code, 0) << jobs.err;
  json list = json::parse(jobs.out, nullptr, false);
  ASSERT_TRUE(list.is_array() && list.size() == 1) << jobs.out;
  EXPECT_EQ(list[0]["state"], "SUCCEEDED");
  // Without the token the same coordinator refuses the client.
  testing::CliResult refused =
      Run("meshrun", {"jobs", "--coordinator", address, "--tls-ca", certs_->ca()});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("requires a bearer token"), std::string::npos) << refused.err;

  Stop(worker);
  Stop(coordinator);
}

}  // namespace
}  // namespace meshrun
