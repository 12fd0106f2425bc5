// A real coordinator in-process on port 0, driven over gRPC by fake workers and a client stub:
// register → session → assignment → rank exits → SUCCEEDED with a WatchJob stream following,
// the rendezvous store, lease expiry, bad requests that leave the server serving, the health
// service, reflection and the metrics endpoint.
#include "coordinator/server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <thread>

#include "coordinator/job_manager.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "tests/coordinator/grpc_test_util.h"
#include "tests/coordinator/test_util.h"
#include "tests/fakes/fake_grpc_worker.h"

namespace meshrun::coordinator {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::FakeGrpcWorker;

class ServerTest : public ::testing::Test {
 protected:
  void Start(milliseconds heartbeat_timeout = seconds(30)) {
    CoordinatorConfig config;
    config.listen = "127.0.0.1:0";
    config.metrics_listen = "127.0.0.1:0";
    config.state_dir = dir_.path();
    config.heartbeat_timeout = heartbeat_timeout;
    auto server = CoordinatorServer::Start(config);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    address_ = "127.0.0.1:" + std::to_string(server_->port());
    channel_ = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
    stub_ = v1::CoordinatorService::NewStub(channel_);
  }

  template <typename Req, typename Resp, typename Method>
  grpc::Status Call(Method method, const Req& req, Resp* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    return (stub_.get()->*method)(&ctx, req, resp);
  }
  std::string Submit(const v1::SubmitJobRequest& req) {
    v1::SubmitJobResponse resp;
    grpc::Status s = Call(&v1::CoordinatorService::Stub::SubmitJob, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.job_id();
  }
  v1::Job GetJob(const std::string& id) {
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::GetJobResponse resp;
    grpc::Status s = Call(&v1::CoordinatorService::Stub::GetJob, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.job();
  }
  bool WaitForState(const std::string& id, v1::JobState state) {
    return testing::WaitFor([&] { return GetJob(id).state() == state; });
  }
  std::unique_ptr<FakeGrpcWorker> Worker(const std::string& name, int slots) {
    auto w = std::make_unique<FakeGrpcWorker>(channel_, name, slots);
    EXPECT_TRUE(w->Register().ok());
    w->Open();
    EXPECT_TRUE(w->WaitAccepted());
    return w;
  }

  testing::TempDir dir_;
  std::unique_ptr<CoordinatorServer> server_;
  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
};

TEST_F(ServerTest, JobRunsToSuccessOverGrpc) {
  Start();
  auto a = Worker("a", 2);
  auto b = Worker("b", 2);
  const std::string id = Submit(testing::SubmitRequest(1, 2, 1, 2));

  // A client follows the job.
  std::vector<v1::JobEvent> events;
  grpc::Status watch_status;
  std::thread watcher([&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(20));
    v1::WatchJobRequest req;
    req.set_job_id(id);
    auto reader = stub_->WatchJob(&ctx, req);
    v1::WatchJobResponse resp;
    while (reader->Read(&resp)) events.push_back(resp.event());
    watch_status = reader->Finish();
  });

  auto as = a->TakeAssignments(2);
  auto bs = b->TakeAssignments(2);
  ASSERT_EQ(as.size(), 2u);
  ASSERT_EQ(bs.size(), 2u);
  EXPECT_EQ(as[0].store().address(), server_->advertised_address());
  for (auto* w : {a.get(), b.get()}) {
    for (const auto& asg : (w == a.get() ? as : bs)) w->Started(asg);
  }
  ASSERT_TRUE(testing::WaitFor([&] {
    v1::Job job = GetJob(id);
    return job.ranks_size() == 4 && job.ranks(3).state() == v1::RANK_STATE_RUNNING;
  }));
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(
      Call(&v1::CoordinatorService::Stub::ListWorkers, v1::ListWorkersRequest(), &workers).ok());
  ASSERT_EQ(workers.workers_size(), 2);
  EXPECT_EQ(workers.workers(0).name(), "a");
  EXPECT_EQ(workers.workers(0).state(), v1::WORKER_STATE_BUSY);
  EXPECT_EQ(workers.workers(0).slots_in_use(), 2);

  for (const auto& asg : as) a->Exited(asg, 0);
  for (const auto& asg : bs) b->Exited(asg, 0);
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED));
  watcher.join();
  EXPECT_TRUE(watch_status.ok()) << watch_status.error_message();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front().state_changed().state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(events.back().state_changed().state(), v1::JOB_STATE_SUCCEEDED);

  v1::ListJobsResponse jobs;
  ASSERT_TRUE(Call(&v1::CoordinatorService::Stub::ListJobs, v1::ListJobsRequest(), &jobs).ok());
  ASSERT_EQ(jobs.jobs_size(), 1);
  EXPECT_EQ(jobs.jobs(0).state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(ServerTest, RendezvousStoreOverGrpc) {
  Start();
  auto a = Worker("a", 1);
  const std::string id = Submit(testing::SubmitRequest(1, 1, 1, 1));
  ASSERT_EQ(a->TakeAssignments(1).size(), 1u);

  v1::StoreSetRequest set;
  set.set_job_id(id);
  set.set_attempt(1);
  set.set_key("addr/0");
  set.set_value(std::string("\x00\x01", 2));
  v1::StoreSetResponse set_resp;
  ASSERT_TRUE(Call(&v1::CoordinatorService::Stub::StoreSet, set, &set_resp).ok());

  v1::StoreGetRequest get;
  get.set_job_id(id);
  get.set_attempt(1);
  get.set_key("addr/0");
  v1::StoreGetResponse got;
  ASSERT_TRUE(Call(&v1::CoordinatorService::Stub::StoreGet, get, &got).ok());
  EXPECT_TRUE(got.found());
  EXPECT_EQ(got.value(), std::string("\x00\x01", 2));

  // A waiting Get is woken by a Set from another caller.
  get.set_key("late");
  get.set_wait(true);
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    v1::StoreSetRequest late = set;
    late.set_key("late");
    late.set_value("v");
    v1::StoreSetResponse r;
    EXPECT_TRUE(Call(&v1::CoordinatorService::Stub::StoreSet, late, &r).ok());
  });
  grpc::Status woke = Call(&v1::CoordinatorService::Stub::StoreGet, get, &got);
  setter.join();
  ASSERT_TRUE(woke.ok()) << woke.error_message();
  EXPECT_EQ(got.value(), "v");

  // A wait that runs out.
  get.set_key("never");
  get.mutable_timeout()->set_nanos(200'000'000);
  grpc::Status timed_out = Call(&v1::CoordinatorService::Stub::StoreGet, get, &got);
  EXPECT_EQ(timed_out.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_NE(timed_out.error_message().find("not set before the wait ran out"), std::string::npos)
      << timed_out.error_message();

  v1::StoreAddRequest add;
  add.set_job_id(id);
  add.set_attempt(1);
  add.set_key("barrier");
  add.set_delta(1);
  v1::StoreAddResponse added;
  ASSERT_TRUE(Call(&v1::CoordinatorService::Stub::StoreAdd, add, &added).ok());
  ASSERT_TRUE(Call(&v1::CoordinatorService::Stub::StoreAdd, add, &added).ok());
  EXPECT_EQ(added.value(), 2);

  set.set_attempt(2);
  EXPECT_EQ(Call(&v1::CoordinatorService::Stub::StoreSet, set, &set_resp).error_code(),
            grpc::StatusCode::ABORTED);
  set.set_job_id("job-404404");
  set.set_attempt(1);
  EXPECT_EQ(Call(&v1::CoordinatorService::Stub::StoreSet, set, &set_resp).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(ServerTest, SilentWorkerIsLostAndTheJobRestartsOnAnother) {
  Start(milliseconds(500));
  auto quiet = Worker("quiet", 1);
  const std::string id = Submit(testing::SubmitRequest(1, 1, 1, 1, /*max_restarts=*/1));
  ASSERT_EQ(quiet->TakeAssignments(1).size(), 1u);
  // A second worker keeps heartbeating; the first says nothing more.
  auto busy = Worker("busy", 1);
  std::atomic<bool> stop{false};
  std::thread beat([&] {
    while (!stop) {
      busy->Heartbeat();
      std::this_thread::sleep_for(milliseconds(50));
    }
  });
  auto ended = quiet->WaitEnded(seconds(10));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->error_code(), grpc::StatusCode::NOT_FOUND);
  auto moved = busy->TakeAssignments(1);
  ASSERT_EQ(moved.size(), 1u);
  EXPECT_EQ(moved[0].attempt(), 2);
  stop = true;
  beat.join();
  v1::Job job = GetJob(id);
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_EQ(job.ranks(0).worker_name(), "busy");
}

TEST_F(ServerTest, BadRequestsAreRefusedAndTheServerKeepsServing) {
  Start();
  // Malformed spec.
  v1::SubmitJobRequest bad = testing::SubmitRequest(1, 1, 1, 3);
  v1::SubmitJobResponse resp;
  grpc::Status s = Call(&v1::CoordinatorService::Stub::SubmitJob, bad, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("parallelism.tp_size: ", 0), 0u) << s.error_message();
  // Over the spec limit, and over the message limit.
  v1::SubmitJobRequest big = testing::SubmitRequest(1, 1, 1, 1);
  big.mutable_spec()->set_source_yaml(std::string(1 << 20, 'x'));
  EXPECT_EQ(Call(&v1::CoordinatorService::Stub::SubmitJob, big, &resp).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  big.mutable_spec()->set_source_yaml(std::string(5 << 20, 'x'));
  EXPECT_EQ(Call(&v1::CoordinatorService::Stub::SubmitJob, big, &resp).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  // Unknown and empty ids.
  v1::GetJobRequest get;
  v1::GetJobResponse job;
  EXPECT_EQ(Call(&v1::CoordinatorService::Stub::GetJob, get, &job).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  get.set_job_id("job-nope");
  EXPECT_EQ(Call(&v1::CoordinatorService::Stub::GetJob, get, &job).error_code(),
            grpc::StatusCode::NOT_FOUND);
  // A session that does not start with `open`.
  {
    FakeGrpcWorker w(channel_, "rude", 1);
    ASSERT_TRUE(w.Register().ok());
    grpc::ClientContext ctx;
    auto stream = stub_->WorkerSession(&ctx);
    v1::WorkerSessionRequest hb;
    hb.mutable_heartbeat();
    stream->Write(hb);
    v1::WorkerSessionResponse r;
    EXPECT_FALSE(stream->Read(&r));
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  // Bytes that are not a protobuf at all, through the generic stub.
  {
    grpc::GenericStub generic(channel_);
    grpc::CompletionQueue cq;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
    const char garbage[] = {'\xff', '\xff', '\xff', '\xff', '\x0f'};
    grpc::Slice slice(garbage, sizeof(garbage));
    grpc::ByteBuffer request(&slice, 1);
    auto call =
        generic.PrepareUnaryCall(&ctx, "/meshrun.v1.CoordinatorService/SubmitJob", request, &cq);
    call->StartCall();
    grpc::ByteBuffer response;
    grpc::Status status;
    call->Finish(&response, &status, reinterpret_cast<void*>(1));
    void* tag;
    bool ok;
    cq.Next(&tag, &ok);
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    // gRPC refuses it before any handler runs (1.51's callback API answers UNIMPLEMENTED).
    EXPECT_FALSE(status.ok());
  }
  // Still serving.
  EXPECT_EQ(testing::HealthStatus(channel_), 1);
  auto w = Worker("fine", 1);
  const std::string id = Submit(testing::SubmitRequest(1, 1, 1, 1));
  EXPECT_EQ(w->TakeAssignments(1).size(), 1u);
  EXPECT_EQ(GetJob(id).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(ServerTest, HealthReflectionAndMetrics) {
  Start();
  EXPECT_EQ(testing::HealthStatus(channel_), 1);
  const std::string services = testing::ReflectionListServices(channel_);
  EXPECT_NE(services.find("meshrun.v1.CoordinatorService"), std::string::npos);
  EXPECT_NE(services.find("grpc.health.v1.Health"), std::string::npos);

  auto w = Worker("a", 2);
  Submit(testing::SubmitRequest(1, 2, 1, 1));
  const std::vector<v1::RankAssignment> assigned = w->TakeAssignments(2);
  ASSERT_EQ(assigned.size(), 2u);
  // Each rank reports step 1: the coordinator serves it with the rank's placement labels.
  for (const v1::RankAssignment& a : assigned) {
    ASSERT_TRUE(w->Started(a));
    v1::WorkerSessionRequest m;
    v1::MetricsSample* s = m.mutable_metrics()->mutable_sample();
    s->set_job_id(a.job_id());
    s->set_attempt(a.attempt());
    s->set_rank(a.rank());
    s->set_step(1);
    s->set_loss(2.5);
    s->set_step_seconds(0.25);
    ASSERT_TRUE(w->Send(m));
  }
  // Scrape /metrics with a plain socket.
  auto scrape = [this] {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(server_->metrics_port());
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    std::string body;
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      const std::string request = "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n";
      if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
        char buf[4096];
        ssize_t n;
        while ((n = read(fd, buf, sizeof(buf))) > 0) body.append(buf, n);
      }
    }
    close(fd);
    return body;
  };
  const std::string rank1 =
      "meshrun_rank_loss{job_id=\"job-000001\",rank=\"1\",worker=\"a\",pp=\"0\","
      "dp_replicate=\"0\","
      "dp_shard=\"1\",cp=\"0\",tp=\"0\"} 2.5";
  const std::string job_step = "meshrun_job_step{job_id=\"job-000001\"} 1";
  std::string body = scrape();
  // Both series: the job's step is aggregated from the ranks' samples, which may land after
  // rank 1's own series does.
  for (auto deadline = std::chrono::steady_clock::now() + seconds(10);
       (body.find(rank1) == std::string::npos || body.find(job_step) == std::string::npos) &&
       std::chrono::steady_clock::now() < deadline;) {
    std::this_thread::sleep_for(milliseconds(20));
    body = scrape();
  }
  EXPECT_NE(body.find(rank1), std::string::npos) << body;
  EXPECT_NE(body.find(job_step), std::string::npos) << body;
  EXPECT_NE(body.find("meshrun_jobs{state=\"RUNNING\"} 1"), std::string::npos) << body;
  EXPECT_NE(body.find("meshrun_workers{state=\"BUSY\"} 1"), std::string::npos);
  EXPECT_NE(body.find("meshrun_job_state{job_id=\"job-000001\",state=\"RUNNING\"} 1"),
            std::string::npos);

  server_->Shutdown();
  EXPECT_NE(testing::HealthStatus(channel_, milliseconds(500)), 1);
  auto ended = w->WaitEnded(seconds(5));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->error_code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace meshrun::coordinator
