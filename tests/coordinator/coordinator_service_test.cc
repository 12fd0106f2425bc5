// CoordinatorServiceImpl over real managers, a fake clock and fake streams (no sockets): the
// session protocol, malformed and out-of-order messages, store errors, worker states, lease
// expiry through Tick, and shutdown.
#include "coordinator/coordinator_service.h"

#include <gtest/gtest.h>

#include "tests/coordinator/coordinator_fixture.h"
#include "tests/coordinator/test_util.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_streams.h"

namespace meshrun::coordinator {
namespace {

using std::chrono::milliseconds;
using testing::FakeSessionStream;
using testing::FakeWatchStream;

using testing::Call;

class CoordinatorServiceTest : public CoordinatorServiceFixture {};

TEST_F(CoordinatorServiceTest, FullFlowThroughSessions) {
  auto a = Connect("a", 2);
  auto b = Connect("b", 2);
  ASSERT_EQ(a->sent(v1::WorkerSessionResponse::kAccepted).size(), 1u);
  const std::string id = Submit(1, 2, 1, 2);
  auto as = a->sent(v1::WorkerSessionResponse::kAssign);
  auto bs = b->sent(v1::WorkerSessionResponse::kAssign);
  ASSERT_EQ(as.size() + bs.size(), 4u);
  for (const auto& [stream, msgs] : {std::pair{a, as}, std::pair{b, bs}}) {
    for (const auto& m : msgs) {
      v1::WorkerSessionRequest up;
      up.mutable_rank_started()->set_job_id(id);
      up.mutable_rank_started()->set_attempt(1);
      up.mutable_rank_started()->set_rank(m.assign().rank());
      up.mutable_rank_started()->set_pid(42);
      service_->HandleWorkerSessionRequest(stream, up);
    }
  }
  for (const auto& w : ListWorkers()) {
    EXPECT_EQ(w.state(), v1::WORKER_STATE_BUSY);
    EXPECT_EQ(w.slots_in_use(), 2);
  }
  for (const auto& [stream, msgs] : {std::pair{a, as}, std::pair{b, bs}}) {
    for (const auto& m : msgs) {
      v1::WorkerSessionRequest up;
      up.mutable_rank_exited()->set_job_id(id);
      up.mutable_rank_exited()->set_attempt(1);
      up.mutable_rank_exited()->set_rank(m.assign().rank());
      service_->HandleWorkerSessionRequest(stream, up);
    }
  }
  EXPECT_EQ(GetJob(id).state(), v1::JOB_STATE_SUCCEEDED);
  for (const auto& w : ListWorkers()) EXPECT_EQ(w.state(), v1::WORKER_STATE_READY);
}

TEST_F(CoordinatorServiceTest, SessionMustOpenFirstAndOnce) {
  auto s = std::make_shared<FakeSessionStream>();
  v1::WorkerSessionRequest hb;
  hb.mutable_heartbeat();
  service_->HandleWorkerSessionRequest(s, hb);
  ASSERT_TRUE(s->finished().has_value());
  EXPECT_EQ(s->finished()->code(), StatusCode::kFailedPrecondition);

  auto a = Connect("a", 1);
  v1::WorkerSessionRequest open;
  open.mutable_open()->set_worker_id("wkr-1");
  service_->HandleWorkerSessionRequest(a, open);
  ASSERT_TRUE(a->finished().has_value());
  EXPECT_EQ(a->finished()->code(), StatusCode::kFailedPrecondition);

  auto bad = std::make_shared<FakeSessionStream>();
  open.mutable_open()->set_session_token("wrong");
  service_->HandleWorkerSessionRequest(bad, open);
  EXPECT_EQ(bad->finished()->code(), StatusCode::kUnauthenticated);
  open.mutable_open()->set_worker_id("wkr-77");
  auto unknown = std::make_shared<FakeSessionStream>();
  service_->HandleWorkerSessionRequest(unknown, open);
  EXPECT_EQ(unknown->finished()->code(), StatusCode::kNotFound);
}

TEST_F(CoordinatorServiceTest, MalformedSessionMessagesEndTheStream) {
  std::vector<v1::WorkerSessionRequest> bad(4);
  bad[0].mutable_rank_exited()->set_attempt(1);                 // no job_id
  bad[1].mutable_rank_started()->set_job_id("j");               // attempt 0
  bad[2].mutable_metrics()->mutable_sample()->set_job_id("j");  // no rank
  // bad[3]: no kind at all
  const char* fields[] = {"rank_exited.job_id", "rank_started.attempt", "metrics.sample.rank",
                          "kind"};
  for (size_t i = 0; i < bad.size(); ++i) {
    auto s = Connect("w" + std::to_string(i), 1);
    service_->HandleWorkerSessionRequest(s, bad[i]);
    ASSERT_TRUE(s->finished().has_value()) << i;
    EXPECT_EQ(s->finished()->code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s->finished()->message().rfind(fields[i], 0), 0u) << s->finished()->message();
  }
  // Messages about unknown jobs are not errors: they are dropped (and stopped).
  auto s = Connect("ok", 1);
  v1::WorkerSessionRequest stale;
  stale.mutable_rank_started()->set_job_id("job-404");
  stale.mutable_rank_started()->set_attempt(1);
  service_->HandleWorkerSessionRequest(s, stale);
  EXPECT_FALSE(s->finished().has_value());
  EXPECT_EQ(s->sent(v1::WorkerSessionResponse::kStop).size(), 1u);
}

TEST_F(CoordinatorServiceTest, StoreErrors) {
  v1::StoreSetRequest set;
  v1::StoreSetResponse set_resp;
  auto store_set = [&] {
    return Call([&](ReplyCallback d) { service_->HandleStoreSet(set, &set_resp, d); });
  };
  EXPECT_EQ(store_set().code(), StatusCode::kInvalidArgument);  // empty job_id
  set.set_job_id("job-404");
  set.set_attempt(1);
  set.set_key("k");
  EXPECT_EQ(store_set().code(), StatusCode::kNotFound);
  Connect("a", 1);
  set.set_job_id(Submit(1, 1, 1, 1));
  EXPECT_TRUE(store_set().ok());
  set.set_attempt(0);
  EXPECT_EQ(store_set().code(), StatusCode::kInvalidArgument);
  set.set_attempt(2);
  EXPECT_EQ(store_set().code(), StatusCode::kAborted);
  set.set_attempt(1);
  set.clear_key();
  EXPECT_EQ(store_set().code(), StatusCode::kInvalidArgument);

  // A wait bounded by its timeout, and by the call's deadline.
  v1::StoreGetRequest get;
  get.set_job_id(set.job_id());
  get.set_attempt(1);
  get.set_key("never");
  get.set_wait(true);
  get.mutable_timeout()->set_seconds(5);
  v1::StoreGetResponse get_resp;
  std::optional<Status> answer;
  service_->HandleStoreGet(get, &get_resp, clock_.Now() + milliseconds(300),
                           [&](const Status& s) { answer = s; });
  EXPECT_FALSE(answer.has_value());
  clock_.Advance(milliseconds(300));
  service_->Tick();
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->code(), StatusCode::kDeadlineExceeded);

  v1::StoreAddRequest add;
  add.set_job_id(set.job_id());
  add.set_attempt(1);
  add.set_key("n");
  add.set_delta(2);
  v1::StoreAddResponse add_resp;
  EXPECT_TRUE(Call([&](ReplyCallback d) { service_->HandleStoreAdd(add, &add_resp, d); }).ok());
  EXPECT_EQ(add_resp.value(), 2);
}

TEST_F(CoordinatorServiceTest, SilentWorkerIsLostAndItsJobFails) {
  auto a = Connect("a", 1);
  const std::string id = Submit(1, 1, 1, 1);
  EXPECT_EQ(GetJob(id).state(), v1::JOB_STATE_RUNNING);
  clock_.Advance(milliseconds(1000));
  service_->Tick();
  ASSERT_TRUE(a->finished().has_value());
  EXPECT_EQ(a->finished()->code(), StatusCode::kNotFound);
  EXPECT_EQ(ListWorkers()[0].state(), v1::WORKER_STATE_LOST);
  v1::Job job = GetJob(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.ranks(0).state(), v1::RANK_STATE_LOST);
  EXPECT_NE(job.message().find("worker a was lost"), std::string::npos) << job.message();
}

TEST_F(CoordinatorServiceTest, ShutdownRefusesCallsAndEndsStreams) {
  auto a = Connect("a", 1);
  const std::string id = Submit(1, 1, 1, 1);
  auto watch = std::make_shared<FakeWatchStream>();
  v1::WatchJobRequest wreq;
  wreq.set_job_id(id);
  service_->HandleWatchJob(wreq, watch);
  EXPECT_FALSE(watch->finished().has_value());
  service_->Shutdown();
  EXPECT_EQ(a->finished()->code(), StatusCode::kUnavailable);
  EXPECT_EQ(watch->finished()->code(), StatusCode::kUnavailable);
  v1::GetJobRequest req;
  req.set_job_id(id);
  v1::GetJobResponse resp;
  EXPECT_EQ(Call([&](ReplyCallback d) { service_->HandleGetJob(req, &resp, d); }).code(),
            StatusCode::kUnavailable);
}

// The figures a worker measured at registration, as meshrun-worker reports them.
v1::RegisterWorkerRequest Calibrated(const std::string& name, int slots, double gemm_flops) {
  v1::RegisterWorkerRequest req;
  req.set_name(name);
  req.set_slots(slots);
  req.set_device("cpu");
  req.set_address("127.0.0.1");
  req.mutable_calibration()->set_gemm_flops(gemm_flops);
  req.mutable_calibration()->set_loopback_bus_bandwidth(2e9);
  req.mutable_calibration()->set_loopback_latency_seconds(1.2e-4);
  req.mutable_calibration()->set_loopback_ranks(slots);
  return req;
}

// A spec that says parallelism.auto, as a plain gRPC client sends it: no sizes, nothing chosen.
v1::SubmitJobRequest AutoRequest() {
  v1::SubmitJobRequest req = testing::SubmitRequest(1, 1, 1, 1);
  v1::ParallelismSpec* p = req.mutable_spec()->mutable_parallelism();
  p->set_auto_(true);
  p->clear_dp_replicate_size();
  p->clear_dp_shard_size();
  p->clear_cp_size();
  p->clear_tp_size();
  req.mutable_spec()->mutable_train()->set_global_batch_size(8);
  return req;
}

TEST(CoordinatorServiceAutoTest, ResolvesAutoForTheLiveWorkersAfterARestartWithTheirFigures) {
  testing::TempDir dir;
  testing::FakeClock clock;
  StoreManager store{clock, StoreLimits{}};
  WorkerManagerConfig wcfg;
  wcfg.lease_ttl = milliseconds(10'000);
  JobManagerConfig jcfg;
  jcfg.store_address = "coord:1";
  // Two workers of one host register with their measured figures, then the coordinator stops.
  {
    auto db = StateDb::Open(dir.path());
    ASSERT_TRUE(db.ok());
    WorkerManager workers(db->get(), clock, wcfg);
    ASSERT_TRUE(workers.Load().ok());
    JobManager jobs(nullptr, workers, store, clock, jcfg);
    CoordinatorServiceImpl service(jobs, workers, store, clock);
    for (const char* name : {"a", "b"}) {
      v1::RegisterWorkerResponse resp;
      ASSERT_TRUE(Call([&](ReplyCallback d) {
                    service.HandleRegisterWorker(Calibrated(name, 2, 4e10), &resp, d);
                  }).ok());
    }
  }
  // The restarted coordinator knows their figures before they register again (their sessions
  // reopen with the same token), and plans with them.
  auto db = StateDb::Open(dir.path());
  ASSERT_TRUE(db.ok());
  WorkerManager workers(db->get(), clock, wcfg);
  ASSERT_TRUE(workers.Load().ok());
  JobManager jobs(nullptr, workers, store, clock, jcfg);
  ServiceOptions options;
  options.planning_host.memory_bytes = 64e9;
  options.planning_host.gemm_flops = [] {
    ADD_FAILURE() << "every worker calibrated: the planning host's rate is not needed";
    return 1e9;
  };
  CoordinatorServiceImpl service(jobs, workers, store, clock, options);
  v1::ListWorkersResponse listed;
  ASSERT_TRUE(Call([&](ReplyCallback d) {
                service.HandleListWorkers(v1::ListWorkersRequest(), &listed, d);
              }).ok());
  const std::vector<v1::WorkerInfo> live(listed.workers().begin(), listed.workers().end());
  ASSERT_EQ(live.size(), 2u);
  for (const v1::WorkerInfo& w : live) EXPECT_DOUBLE_EQ(w.calibration().gemm_flops(), 4e10);
  StatusOr<ClusterShape> cluster = ClusterOfWorkers(live, "cpu", options.planning_host);
  ASSERT_TRUE(cluster.ok()) << cluster.status().message();
  EXPECT_EQ(cluster->world(), 4);
  EXPECT_DOUBLE_EQ(cluster->device.flops, 1e10) << "one host's rate over its 4 ranks";
  EXPECT_DOUBLE_EQ(cluster->device.intra_node_latency, 1.2e-4);

  // What `meshrun submit` (and `plan --coordinator`) choose for these workers ...
  const v1::SubmitJobRequest request = AutoRequest();
  StatusOr<JobSpec> spec = JobSpecFromProto(request.spec());
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  StatusOr<MeshChoice> expected = ChooseMesh(*spec, *cluster);
  ASSERT_TRUE(expected.ok()) << expected.status().message();
  ASSERT_TRUE(expected->has_runner_up);
  // ... is what the coordinator chooses for a client that sent auto unresolved.
  v1::SubmitJobResponse resp;
  ASSERT_TRUE(Call([&](ReplyCallback d) { service.HandleSubmitJob(request, &resp, d); }).ok());
  v1::GetJobRequest get;
  get.set_job_id(resp.job_id());
  v1::GetJobResponse got;
  ASSERT_TRUE(Call([&](ReplyCallback d) { service.HandleGetJob(get, &got, d); }).ok());
  const v1::JobSpec& stored = got.job().spec();
  EXPECT_FALSE(stored.parallelism().auto_());
  EXPECT_EQ(stored.parallelism().dp_replicate_size(), expected->spec.parallelism.dp_replicate_size);
  EXPECT_EQ(stored.parallelism().dp_shard_size(), expected->spec.parallelism.dp_shard_size);
  EXPECT_EQ(stored.parallelism().cp_size(), expected->spec.parallelism.cp_size);
  EXPECT_EQ(stored.parallelism().tp_size(), expected->spec.parallelism.tp_size);
  EXPECT_EQ(stored.auto_choice(), expected->text) << "the choice and its runner-up, recorded";
  EXPECT_NE(stored.auto_choice().find("runner-up "), std::string::npos);
  EXPECT_DOUBLE_EQ(stored.predicted_step_seconds(), expected->best.step_seconds);
  EXPECT_EQ(got.job().world_size(), 4);
}

TEST(CoordinatorServiceAutoTest, AutoWithoutLiveWorkersIsInvalidArgument) {
  testing::FakeClock clock;
  StoreManager store{clock, StoreLimits{}};
  WorkerManager workers(nullptr, clock, WorkerManagerConfig{});
  JobManagerConfig jcfg;
  jcfg.store_address = "coord:1";
  JobManager jobs(nullptr, workers, store, clock, jcfg);
  CoordinatorServiceImpl service(jobs, workers, store, clock);
  v1::SubmitJobResponse resp;
  Status s = Call([&](ReplyCallback d) { service.HandleSubmitJob(AutoRequest(), &resp, d); });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("parallelism.auto: there is nothing to plan for", 0), 0u)
      << s.message();
}

}  // namespace
}  // namespace meshrun::coordinator
