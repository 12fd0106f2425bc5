// Text from the network reaching terminals and logs (the third security review): a fake worker
// and clients written against the protos inject ESC, a C1 control (U+009B in UTF-8, and a raw
// 0x9b byte), a newline and a bidi override through every field that is shown or logged (a
// rank's log line, checkpoint_saved.path, rank_exited.error, CancelJob's reason, the worker's
// registration fields), then the built `meshrun` shows them: `submit --follow --logs`, `status`,
// `jobs`, `logs` (also --follow), `workers`, each in text and JSON. Neither their output nor the
// coordinator's log may hold any of those characters raw, the escaped forms must be there, and
// the forged newline must not start a line. Names and reasons are refused. A real
// meshrun-coordinator on loopback; every wait is bounded.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/escape.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "tests/client/cli_runner.h"
#include "tests/fakes/fake_grpc_worker.h"
#include "tests/integration/daemons.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// ESC + CSI "31m", the one-character CSI U+009B, a newline starting a forged line, and the
// right-to-left override U+202E.
constexpr char kEvil[] =
    "A\x1b[31mB\xc2\x9b"
    "2JC\nFORGED-LINE D\xe2\x80\xae"
    "E";
// How text output shows it (EscapeText), and how JSON output does.
constexpr char kEscaped[] = "A\\x1b[31mB\\u009b2JC\\x0aFORGED-LINE D\\u202eE";
constexpr char kJsonEscaped[] = "A\\u001b[31mB\\u009b2JC\\nFORGED-LINE D\\u202eE";
// A raw C1 byte: not UTF-8, so gRPC (protobuf's proto3 strings) cannot even carry it.
constexpr char kRawC1[] =
    "A\x9b"
    "2JB";

// "" when `text` holds nothing a terminal or a log reader would act on: no C0 control but the
// newlines and tabs that lay it out, no DEL, no C1 control (UTF-8 or raw), no bidi control, no
// invalid UTF-8, and no line that the forged newline started. Else what was found.
std::string Unsafe(const std::string& text) {
  for (const std::string& line : testing::Lines(text)) {
    std::string cells = line;
    std::erase(cells, '\t');
    if (!IsPlainText(cells)) return "unsafe line: " + EscapeText(line);
    if (line.rfind("FORGED-LINE", 0) == 0) return "forged line: " + line;
  }
  if (text.find('\x1b') != std::string::npos) return "ESC";
  if (text.find("\xc2\x9b") != std::string::npos) return "U+009B";
  if (text.find("\xe2\x80\xae") != std::string::npos) return "U+202E";
  return "";
}

class AdversaryTextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* bin : {"meshrun", "meshrun-coordinator"}) {
      if (!fs::exists(testing::BinDir() / bin)) {
        GTEST_SKIP() << (testing::BinDir() / bin) << " is not built";
      }
    }
    char pattern[] = "/tmp/meshrun_adversary_text_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    address_ = "127.0.0.1:" + std::to_string(testing::FreePort());
    coordinator_ =
        testing::Spawn("coordinator",
                       {(testing::BinDir() / "meshrun-coordinator").string(), "--listen", address_,
                        "--state-dir", (dir_ / "state").string(), "--heartbeat-timeout", "30"},
                       dir_ / "coordinator.log");
    bool ready = false;
    for (int i = 0; i < 200 && !ready; ++i) {
      ready = Cli({"jobs", "-o", "json"}, 5).exit_code == 0;
      if (!ready) std::this_thread::sleep_for(50ms);
    }
    ASSERT_TRUE(ready) << "the coordinator did not answer on " << address_ << ": "
                       << testing::ReadFile(dir_ / "coordinator.log");
    channel_ = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
    stub_ = v1::CoordinatorService::NewStub(channel_);
    std::ofstream(dir_ / "job.yaml")
        << "name: evil-text\n"
           "model: {arch: gpt2, n_layer: 2, n_head: 4, d_model: 64, seq_len: 64, vocab_size: 256}\n"
           "parallelism: {dp_replicate_size: 1, dp_shard_size: 1, cp_size: 1, tp_size: 2}\n"
           "train: {steps: 5, global_batch_size: 8, micro_batch_size: 2}\n"
           "data: {train: "
        << (dir_ / "train.txt").string()
        << ", format: text}\n"
           "checkpoint: {dir: "
        << (dir_ / "ckpt").string() << ", every: 1}\n";
    std::ofstream(dir_ / "train.txt") << "hello world\n";
  }

  void TearDown() override {
    worker_.reset();
    testing::Stop(follower_, 5s);
    testing::Stop(coordinator_, 10s);
    if (HasFailure()) {
      std::cerr << "logs kept in " << dir_ << std::endl;
    } else if (!dir_.empty()) {
      fs::remove_all(dir_);
    }
  }

  testing::CliResult Cli(std::vector<std::string> args, int timeout_s = 30) {
    args.push_back("--coordinator");
    args.push_back(address_);
    return testing::RunCli(testing::BinDir() / "meshrun", args, dir_ / "cli.err", timeout_s);
  }

  // stdout and stderr of a command that shows the evil text: nothing raw, the escaped form there.
  void ExpectEscaped(const std::vector<std::string>& args, const std::string& escaped) {
    testing::CliResult r = Cli(args);
    const std::string what = "meshrun " + testing::ShellQuote(args[0]) +
                             (args.size() > 1 ? " " + args[1] : "") +
                             (args.size() > 2 ? " " + args[2] : "");
    EXPECT_EQ(Unsafe(r.out), "") << what << " stdout:\n" << EscapeText(r.out);
    EXPECT_EQ(Unsafe(r.err), "") << what << " stderr:\n" << EscapeText(r.err);
    if (!escaped.empty()) {
      EXPECT_NE(r.out.find(escaped), std::string::npos)
          << what << " does not show " << escaped << ":\n"
          << EscapeText(r.out);
    }
  }

  grpc::Status Register(const std::string& name, const std::string& field,
                        const std::string& value) {
    v1::RegisterWorkerRequest req;
    req.set_name(name);
    req.set_slots(1);
    req.set_device("cpu");
    req.set_address("127.0.0.1");
    req.set_version("test");
    if (field == "address") req.set_address(value);
    if (field == "metrics_address") req.set_metrics_address(value);
    if (field == "device_name") req.set_device_name(value);
    if (field == "version") req.set_version(value);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    v1::RegisterWorkerResponse resp;
    return stub_->RegisterWorker(&ctx, req, &resp);
  }

  grpc::Status Cancel(const std::string& job, const std::string& reason) {
    v1::CancelJobRequest req;
    req.set_job_id(job);
    req.set_reason(reason);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    v1::CancelJobResponse resp;
    return stub_->CancelJob(&ctx, req, &resp);
  }

  fs::path dir_;
  std::string address_;
  testing::Daemon coordinator_;
  testing::Daemon follower_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
  std::unique_ptr<testing::FakeGrpcWorker> worker_;
};

TEST_F(AdversaryTextTest, WorkerFieldsWithControlsAreRefusedNamingTheField) {
  const std::vector<std::string> evil = {"w\x1b[2J",      "w\xc2\x9b",     "w\nforged",
                                         "w\xe2\x80\xae", "w\xe2\x81\xa6", "w\xc2\x85"};
  for (const std::string& value : evil) {
    grpc::Status s = Register(value, "", "");
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << EscapeText(value);
    EXPECT_EQ(s.error_message().rfind("name: ", 0), 0u) << EscapeText(s.error_message());
    EXPECT_EQ(Unsafe(s.error_message()), "") << EscapeText(s.error_message());
    for (const char* field : {"address", "metrics_address", "device_name", "version"}) {
      s = Register("plain-worker", field, value);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << field << " " << EscapeText(value);
      EXPECT_EQ(s.error_message().rfind(std::string(field) + ": ", 0), 0u)
          << EscapeText(s.error_message());
      // The message quotes the value escaped.
      EXPECT_EQ(Unsafe(s.error_message()), "") << EscapeText(s.error_message());
    }
  }
  // A raw C1 byte is not UTF-8: refused before any handler sees it.
  EXPECT_FALSE(Register("plain-worker", "address", kRawC1).ok());
  EXPECT_FALSE(Register("plain-worker", "device_name", kRawC1).ok());

  // Nothing of it was registered, and `workers` shows only plain text.
  worker_ = std::make_unique<testing::FakeGrpcWorker>(channel_, "fake-1", 2);
  ASSERT_TRUE(worker_->Register().ok());
  for (const char* output : {"text", "json"}) {
    testing::CliResult r = Cli({"workers", "-o", output});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(Unsafe(r.out), "") << EscapeText(r.out);
    EXPECT_NE(r.out.find("fake-1"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("plain-worker"), std::string::npos) << r.out;
  }
  EXPECT_EQ(Unsafe(testing::ReadFile(dir_ / "coordinator.log")), "");
}

TEST_F(AdversaryTextTest, WorkerTextIsEscapedInEveryCommandAndTheLog) {
  worker_ = std::make_unique<testing::FakeGrpcWorker>(channel_, "fake-1", 2);
  ASSERT_TRUE(worker_->Register().ok());
  worker_->Open();
  ASSERT_TRUE(worker_->WaitAccepted());

  // Another user follows the job with its logs from the start.
  follower_ = testing::Spawn(
      "follow",
      {(testing::BinDir() / "meshrun").string(), "submit", "-f", (dir_ / "job.yaml").string(),
       "--follow", "--logs", "--skip-local-checks", "--coordinator", address_},
      dir_ / "follow.log");
  std::vector<v1::RankAssignment> assigned = worker_->TakeAssignments(2, 30s);
  ASSERT_EQ(assigned.size(), 2u) << testing::ReadFile(dir_ / "follow.log");
  const std::string job = assigned[0].job_id();
  const int attempt = assigned[0].attempt();
  for (const auto& a : assigned) ASSERT_TRUE(worker_->Started(a));

  // A compromised worker's log line, checkpoint path and exit error.
  v1::WorkerSessionRequest logs;
  v1::LogLine* line = logs.mutable_logs()->add_lines();
  line->set_job_id(job);
  line->set_attempt(attempt);
  line->set_rank(0);
  line->set_text(kEvil);
  ASSERT_TRUE(worker_->Send(logs));
  v1::WorkerSessionRequest saved;
  saved.mutable_checkpoint_saved()->set_job_id(job);
  saved.mutable_checkpoint_saved()->set_attempt(attempt);
  saved.mutable_checkpoint_saved()->set_step(1);
  saved.mutable_checkpoint_saved()->set_path((dir_ / "ckpt" / "step-00000001").string() + kEvil);
  ASSERT_TRUE(worker_->Send(saved));
  v1::WorkerSessionRequest exited;
  exited.mutable_rank_exited()->set_job_id(job);
  exited.mutable_rank_exited()->set_attempt(attempt);
  exited.mutable_rank_exited()->set_rank(0);
  exited.mutable_rank_exited()->set_exit_code(1);
  exited.mutable_rank_exited()->set_error(kEvil);
  v1::WorkerSessionRequest long_line = logs;
  std::string text = "x";
  while (text.size() < 20000) text += "\xc3\xa9";  // é: the 16 KiB cut falls inside one
  long_line.mutable_logs()->mutable_lines(0)->set_rank(1);
  long_line.mutable_logs()->mutable_lines(0)->set_text(text);
  const bool long_line_sent = worker_->Send(long_line);
  ASSERT_TRUE(worker_->Send(exited));
  for (const v1::StopOrder& stop : worker_->TakeStops(1, 10s)) {
    (void)stop;
    worker_->Exited(assigned[1], 0, /*stopped=*/true);
  }

  // `submit --follow` ends with the job (FAILED).
  ASSERT_TRUE(testing::WaitExit(follower_.pid, 30s)) << testing::ReadFile(dir_ / "follow.log");
  follower_.pid = -1;
  const std::string followed = testing::ReadFile(dir_ / "follow.log");
  EXPECT_NE(followed.find("FAILED"), std::string::npos) << EscapeText(followed);
  EXPECT_EQ(Unsafe(followed), "") << EscapeText(followed);
  // The log line, the checkpoint path, the rank's error and the job's reason: all escaped.
  EXPECT_NE(followed.find("[rank 0] " + std::string(kEscaped)), std::string::npos)
      << EscapeText(followed);
  // The forged checkpoint path is not the job's step folder: the coordinator ignores it.
  EXPECT_EQ(followed.find("step-00000001"), std::string::npos) << EscapeText(followed);
  EXPECT_NE(followed.find("exited with code 1: " + std::string(kEscaped)), std::string::npos)
      << EscapeText(followed);

  ExpectEscaped({"status", job}, kEscaped);
  // A line longer than the coordinator keeps (16 KiB) whose cut falls inside a character:
  // the kept part is still UTF-8, or no client could parse the events that carry it (`logs`
  // reads the stored lines, `logs --follow` the events).
  ASSERT_TRUE(long_line_sent);
  testing::CliResult long_logs = Cli({"logs", job});
  EXPECT_EQ(long_logs.exit_code, 0) << long_logs.err;
  EXPECT_NE(long_logs.out.find("[rank 1] x\u00e9\u00e9"), std::string::npos) << long_logs.err;
  long_logs = Cli({"logs", job, "--follow"});
  EXPECT_EQ(long_logs.exit_code, 1) << long_logs.err;  // the job FAILED
  EXPECT_NE(long_logs.out.find("[rank 1] x\u00e9\u00e9"), std::string::npos) << long_logs.err;
  ExpectEscaped({"status", job, "-o", "json"}, kJsonEscaped);
  ExpectEscaped({"jobs"}, "");
  ExpectEscaped({"jobs", "-o", "json"}, kJsonEscaped);
  ExpectEscaped({"logs", job}, "[rank 0] " + std::string(kEscaped));
  ExpectEscaped({"logs", job, "--follow"}, "[rank 0] " + std::string(kEscaped));
  ExpectEscaped({"logs", job, "-o", "json"}, kJsonEscaped);
  ExpectEscaped({"workers"}, "fake-1");
  ExpectEscaped({"workers", "-o", "json"}, "fake-1");
  // An error quoting what the user typed comes back escaped too.
  testing::CliResult missing = Cli({"status", std::string("job-\x1b[2J\xc2\x9b")});
  EXPECT_EQ(missing.exit_code, 1) << missing.err;
  EXPECT_EQ(Unsafe(missing.err), "") << EscapeText(missing.err);
  EXPECT_NE(missing.err.find("job-\\x1b[2J\\u009b"), std::string::npos) << missing.err;

  // The coordinator's log: the rank's error is there, escaped, on its own line.
  const std::string log = testing::ReadFile(dir_ / "coordinator.log");
  EXPECT_EQ(Unsafe(log), "") << EscapeText(log);
  EXPECT_NE(log.find(kEscaped), std::string::npos) << log;
}

TEST_F(AdversaryTextTest, CancelReasonWithControlsIsRefused) {
  worker_ = std::make_unique<testing::FakeGrpcWorker>(channel_, "fake-1", 2);
  ASSERT_TRUE(worker_->Register().ok());
  worker_->Open();
  ASSERT_TRUE(worker_->WaitAccepted());
  testing::CliResult submitted =
      Cli({"submit", "-f", (dir_ / "job.yaml").string(), "--skip-local-checks"});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  const std::string job = testing::Lines(submitted.out).at(0);
  std::vector<v1::RankAssignment> assigned = worker_->TakeAssignments(2, 30s);
  ASSERT_EQ(assigned.size(), 2u);
  for (const auto& a : assigned) ASSERT_TRUE(worker_->Started(a));

  for (const std::string& reason : {std::string(kEvil), std::string("x\xc2\x9b"),
                                    std::string("x\xe2\x81\xa7"), std::string("a\tb")}) {
    grpc::Status s = Cancel(job, reason);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << EscapeText(reason);
    EXPECT_EQ(s.error_message().rfind("reason: ", 0), 0u) << EscapeText(s.error_message());
    EXPECT_EQ(Unsafe(s.error_message()), "") << EscapeText(s.error_message());
  }
  EXPECT_FALSE(Cancel(job, kRawC1).ok());
  // Through the client: exit 2, one escaped error line naming the field.
  testing::CliResult cancel = Cli({"cancel", job, "--reason", kEvil});
  EXPECT_EQ(cancel.exit_code, 2) << cancel.err;
  EXPECT_EQ(testing::Lines(cancel.err).size(), 1u) << EscapeText(cancel.err);
  EXPECT_EQ(cancel.err.rfind("error: reason: ", 0), 0u) << EscapeText(cancel.err);
  EXPECT_EQ(Unsafe(cancel.err), "") << EscapeText(cancel.err);
  EXPECT_NE(cancel.err.find(kEscaped), std::string::npos) << EscapeText(cancel.err);

  // The job still runs; a plain reason cancels it and is shown as given.
  testing::CliResult status = Cli({"status", job});
  EXPECT_NE(status.out.find("RUNNING"), std::string::npos) << status.out;
  EXPECT_TRUE(Cancel(job, "plain words – ünïcödé").ok());
  status = Cli({"status", job});
  EXPECT_NE(status.out.find("CANCELLED: plain words – ünïcödé"), std::string::npos) << status.out;
  const std::string log = testing::ReadFile(dir_ / "coordinator.log");
  EXPECT_EQ(Unsafe(log), "") << EscapeText(log);
  EXPECT_EQ(log.find("FORGED-LINE"), std::string::npos) << log;
}

}  // namespace
}  // namespace meshrun
