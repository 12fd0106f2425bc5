// The meshrun-coordinator binary: it starts, answers the health check and the metrics scrape,
// stops cleanly on SIGTERM and SIGINT, refuses bad flags with exit code 2, and after kill -9
// a restart on the same --state-dir still has every job (a RUNNING one keeps running while
// its worker reconnects with its old token and reports its rank).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "meshrun/v1/coordinator.grpc.pb.h"
#include "tests/coordinator/grpc_test_util.h"
#include "tests/coordinator/test_util.h"
#include "tests/fakes/fake_grpc_worker.h"

namespace meshrun::coordinator {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::Subprocess;

std::string BinaryPath() {
  const char* dir = std::getenv("MESHRUN_BINARY_DIR");
  return std::string(dir ? dir : "build") + "/bin/meshrun-coordinator";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A running coordinator process and a client stub to it.
struct Coordinator {
  Coordinator(const std::string& state_dir, const std::string& stderr_path,
              std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {
        BinaryPath(),  "--listen",    "127.0.0.1:0", "--metrics-listen",
        "127.0.0.1:0", "--state-dir", state_dir,     "--heartbeat-timeout",
        "30"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    process = std::make_unique<Subprocess>(argv, stderr_path);
    // "meshrun-coordinator listening on 127.0.0.1:PORT metrics MPORT"
    auto line = process->ReadLine(seconds(20));
    if (!line) return;
    std::istringstream words(*line);
    std::string w1, w2, w3, metrics_word;
    words >> w1 >> w2 >> w3 >> address >> metrics_word >> metrics_port;
    channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    stub = v1::CoordinatorService::NewStub(channel);
  }
  bool started() const { return stub != nullptr; }

  std::unique_ptr<Subprocess> process;
  std::string address;
  int metrics_port = 0;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::CoordinatorService::Stub> stub;
};

template <typename Req, typename Resp, typename Method>
grpc::Status Call(v1::CoordinatorService::Stub* stub, Method method, const Req& req, Resp* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
  return (stub->*method)(&ctx, req, resp);
}

v1::Job GetJob(v1::CoordinatorService::Stub* stub, const std::string& id) {
  v1::GetJobRequest req;
  req.set_job_id(id);
  v1::GetJobResponse resp;
  EXPECT_TRUE(Call(stub, &v1::CoordinatorService::Stub::GetJob, req, &resp).ok());
  return resp.job();
}

TEST(BinaryTest, ServesHealthAndStopsCleanlyOnSigterm) {
  testing::TempDir dir;
  Coordinator c(dir.path() + "/state", dir.path() + "/stderr");
  ASSERT_TRUE(c.started()) << ReadFile(dir.path() + "/stderr");
  EXPECT_EQ(testing::HealthStatus(c.channel), 1);
  EXPECT_GT(c.metrics_port, 0);
  c.process->Signal(SIGTERM);
  auto status = c.process->Wait(seconds(15));
  ASSERT_TRUE(status.has_value()) << "did not exit after SIGTERM";
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0);
  EXPECT_NE(ReadFile(dir.path() + "/stderr").find("meshrun-coordinator stopped"),
            std::string::npos);
}

TEST(BinaryTest, SigintStopsItToo) {
  testing::TempDir dir;
  Coordinator c(dir.path() + "/state", dir.path() + "/stderr");
  ASSERT_TRUE(c.started());
  c.process->Signal(SIGINT);
  auto status = c.process->Wait(seconds(15));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
}

TEST(BinaryTest, BadFlagsExitWithTwo) {
  testing::TempDir dir;
  struct Case {
    std::vector<std::string> argv;
    std::string stderr_has;
  };
  const std::vector<Case> cases = {
      {{BinaryPath(), "--listen", "127.0.0.1:0"}, "--state-dir"},
      {{BinaryPath(), "--listen", "nonsense", "--state-dir", dir.path()}, "--listen"},
      {{BinaryPath(), "--state-dir", dir.path(), "--heartbeat-timeout", "-1"},
       "--heartbeat-timeout"},
      {{BinaryPath(), "--state-dir", dir.path(), "--bogus"}, "--bogus"},
  };
  for (const Case& c : cases) {
    Subprocess p(c.argv, dir.path() + "/stderr");
    auto status = p.Wait(seconds(15));
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 2) << c.argv[1];
    const std::string err = ReadFile(dir.path() + "/stderr");
    EXPECT_EQ(err.rfind("error: ", 0), 0u) << err;
    EXPECT_NE(err.find(c.stderr_has), std::string::npos) << err;
  }
}

TEST(BinaryTest, JobsSurviveKillDashNine) {
  testing::TempDir dir;
  const std::string state = dir.path() + "/state";
  std::string pending_id, running_id;
  v1::RegisterWorkerResponse registration;
  v1::RankAssignment assignment;
  {
    Coordinator c(state, dir.path() + "/stderr1");
    ASSERT_TRUE(c.started());
    testing::FakeGrpcWorker w(c.channel, "w1", 1);
    ASSERT_TRUE(w.Register().ok());
    w.Open();
    ASSERT_TRUE(w.WaitAccepted());
    v1::SubmitJobResponse resp;
    ASSERT_TRUE(Call(c.stub.get(), &v1::CoordinatorService::Stub::SubmitJob,
                     testing::SubmitRequest(1, 1, 1, 1), &resp)
                    .ok());
    running_id = resp.job_id();
    auto as = w.TakeAssignments(1);
    ASSERT_EQ(as.size(), 1u);
    assignment = as[0];
    w.Started(assignment);
    ASSERT_TRUE(testing::WaitFor([&] {
      v1::Job j = GetJob(c.stub.get(), running_id);
      return j.ranks_size() == 1 && j.ranks(0).state() == v1::RANK_STATE_RUNNING;
    }));
    ASSERT_TRUE(Call(c.stub.get(), &v1::CoordinatorService::Stub::SubmitJob,
                     testing::SubmitRequest(1, 1, 1, 1), &resp)
                    .ok());
    pending_id = resp.job_id();
    registration = w.registration();
    c.process->Signal(SIGKILL);
    auto status = c.process->Wait(seconds(10));
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(WIFSIGNALED(*status));
    w.Kill();
  }
  Coordinator c(state, dir.path() + "/stderr2");
  ASSERT_TRUE(c.started()) << ReadFile(dir.path() + "/stderr2");
  v1::Job pending = GetJob(c.stub.get(), pending_id);
  EXPECT_EQ(pending.state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(pending.name(), "test-job");
  v1::Job running = GetJob(c.stub.get(), running_id);
  EXPECT_EQ(running.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(running.attempt(), 1);
  ASSERT_EQ(running.ranks_size(), 1);
  EXPECT_EQ(running.ranks(0).worker_name(), "w1");

  // The worker reconnects with its old registration and reports its rank: the job carries on.
  testing::FakeGrpcWorker w(c.channel, "w1", 1);
  // Reuse the registration from before the crash (as a real worker keeps it in memory).
  {
    grpc::ClientContext ctx;
    auto stream = c.stub->WorkerSession(&ctx);
    v1::WorkerSessionRequest open;
    open.mutable_open()->set_worker_id(registration.worker_id());
    open.mutable_open()->set_session_token(registration.session_token());
    *open.mutable_open()->add_running() = testing::FakeGrpcWorker::Running(assignment);
    ASSERT_TRUE(stream->Write(open));
    v1::WorkerSessionResponse accepted;
    ASSERT_TRUE(stream->Read(&accepted));
    EXPECT_TRUE(accepted.has_accepted());
    v1::WorkerSessionRequest exited;
    exited.mutable_rank_exited()->set_job_id(running_id);
    exited.mutable_rank_exited()->set_attempt(1);
    exited.mutable_rank_exited()->set_rank(0);
    ASSERT_TRUE(stream->Write(exited));
    ASSERT_TRUE(testing::WaitFor(
        [&] { return GetJob(c.stub.get(), running_id).state() == v1::JOB_STATE_SUCCEEDED; }));
    // The freed slot goes to the job that was pending before the crash.
    v1::WorkerSessionResponse next;
    ASSERT_TRUE(stream->Read(&next));
    ASSERT_TRUE(next.has_assign());
    EXPECT_EQ(next.assign().job_id(), pending_id);
    stream->WritesDone();
    ctx.TryCancel();
    (void)stream->Finish();
  }
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(
      Call(c.stub.get(), &v1::CoordinatorService::Stub::ListJobs, v1::ListJobsRequest(), &jobs)
          .ok());
  EXPECT_EQ(jobs.jobs_size(), 2);
  c.process->Signal(SIGTERM);
  auto status = c.process->Wait(seconds(15));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
}

}  // namespace
}  // namespace meshrun::coordinator
