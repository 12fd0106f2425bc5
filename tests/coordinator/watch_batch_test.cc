// WatchJob with batch_events over a real in-process coordinator (decision 0063): a worker's
// rank samples sent in batches (RankMetrics.samples) while the watcher reads nothing, so the
// coordinator's writes wait on the client's HTTP/2 window and what queues behind them goes out
// coalesced (WatchJobResponse.more_events); once read, every rank sample and every job-level
// sample arrived exactly once and in sequence order.
#include <gtest/gtest.h>

#include <thread>

#include "coordinator/server.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "tests/coordinator/grpc_test_util.h"
#include "tests/coordinator/test_util.h"
#include "tests/fakes/fake_grpc_worker.h"

namespace meshrun::coordinator {
namespace {

using std::chrono::seconds;
using testing::FakeGrpcWorker;

// A coordinator, one fake worker and a 1-rank job whose rank has started.
class WatchBatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorConfig config;
    config.listen = "127.0.0.1:0";
    config.metrics_listen = "127.0.0.1:0";
    config.state_dir = dir_.path();
    auto started = CoordinatorServer::Start(config);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    server_ = std::move(started).value();
    // A watcher's window stays at its initial 64 KiB (no BDP growth): the first test's events
    // need several times that, so the coordinator's writes must wait for the reader.
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    channel_ = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(server_->port()),
                                         grpc::InsecureChannelCredentials(), args);
    stub_ = v1::CoordinatorService::NewStub(channel_);
    worker_ = std::make_unique<FakeGrpcWorker>(channel_, "w", 1);
    ASSERT_TRUE(worker_->Register().ok());
    worker_->Open();
    ASSERT_TRUE(worker_->WaitAccepted());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    ASSERT_TRUE(stub_->SubmitJob(&ctx, testing::SubmitRequest(1, 1, 1, 1), &submitted_).ok());
    auto assigned = worker_->TakeAssignments(1);
    ASSERT_EQ(assigned.size(), 1u);
    assigned_ = assigned[0];
    worker_->Started(assigned_);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  // One step's rank sample of the job's rank.
  void AddSample(v1::WorkerSessionRequest* m, int step) const {
    v1::MetricsSample* s = m->mutable_metrics()->add_samples();
    s->set_job_id(submitted_.job_id());
    s->set_attempt(1);
    s->set_rank(0);
    s->set_step(step);
    s->set_step_seconds(0.25);
    s->set_loss(3.0);
  }

  testing::TempDir dir_;
  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
  std::unique_ptr<FakeGrpcWorker> worker_;
  v1::SubmitJobResponse submitted_;
  v1::RankAssignment assigned_;
};

TEST_F(WatchBatchTest, CoalescedEventsArriveOnceAndInOrder) {
  auto get_job = [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    v1::GetJobRequest req;
    req.set_job_id(submitted_.job_id());
    req.set_summary(true);
    v1::GetJobResponse resp;
    EXPECT_TRUE(stub_->GetJob(&ctx, req, &resp).ok());
    return resp.job();
  };
  ASSERT_TRUE(testing::WaitFor([&] { return get_job().state() == v1::JOB_STATE_RUNNING; }));

  grpc::ClientContext watch_ctx;
  watch_ctx.set_deadline(std::chrono::system_clock::now() + seconds(60));
  v1::WatchJobRequest wreq;
  wreq.set_job_id(submitted_.job_id());
  wreq.set_rank_metrics(true);
  wreq.set_skip_logs(true);
  wreq.set_batch_events(true);
  auto reader = stub_->WatchJob(&watch_ctx, wreq);

  // 2,000 steps of the one rank, 50 to a session message: 4,000 events of ~100 bytes.
  constexpr int kSteps = 2000;
  for (int first = 1; first <= kSteps; first += 50) {
    v1::WorkerSessionRequest m;
    for (int step = first; step < first + 50; ++step) {
      AddSample(&m, step);
    }
    ASSERT_TRUE(worker_->Send(m));
  }
  ASSERT_TRUE(testing::WaitFor([&] { return get_job().step() == kSteps; }, seconds(60)));

  // Now read: from the first event (the replay) to the last sample.
  std::vector<int64_t> rank_steps, job_steps;
  uint64_t last_sequence = 0;
  bool in_order = true;
  int coalesced = 0;
  v1::WatchJobResponse resp;
  while (job_steps.size() < static_cast<size_t>(kSteps) && reader->Read(&resp)) {
    coalesced += resp.more_events_size() > 0;
    auto take = [&](const v1::JobEvent& e) {
      in_order = in_order && e.sequence() > last_sequence;
      last_sequence = e.sequence();
      if (!e.has_metrics()) return;
      (e.metrics().has_rank() ? rank_steps : job_steps).push_back(e.metrics().step());
    };
    take(resp.event());
    for (const v1::JobEvent& e : resp.more_events()) take(e);
  }
  watch_ctx.TryCancel();
  (void)reader->Finish();
  EXPECT_TRUE(in_order);
  EXPECT_GT(coalesced, 0);  // the writes waited, so responses carried several events
  ASSERT_EQ(rank_steps.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(job_steps.size(), static_cast<size_t>(kSteps));
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_EQ(rank_steps[i], i + 1);
    EXPECT_EQ(job_steps[i], i + 1);
  }
}

// A watcher that keeps up (decision 0073): each event that finds no write in flight waits a
// few milliseconds for the events behind it, so a worker's messages a millisecond apart reach
// the watcher in a few responses, not one each; none is lost, reordered or left behind when
// the job ends while the stream lingers.
TEST_F(WatchBatchTest, EventsThatFindNoWriteInFlightLingerForTheOnesBehindThem) {
  // Two watchers, read as events come: one with batch_events, one without (one event each).
  auto watch = [&](grpc::ClientContext& ctx, bool batch) {
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(60));
    v1::WatchJobRequest wreq;
    wreq.set_job_id(submitted_.job_id());
    wreq.set_rank_metrics(true);
    wreq.set_skip_logs(true);
    wreq.set_batch_events(batch);
    return stub_->WatchJob(&ctx, wreq);
  };
  struct Seen {
    int responses = 0;
    std::vector<int64_t> rank_steps;
    bool in_order = true;
    bool ended_with_success = false;
  };
  auto read_all = [](grpc::ClientReaderInterface<v1::WatchJobResponse>* reader, Seen* seen) {
    uint64_t last = 0;
    v1::WatchJobResponse resp;
    while (reader->Read(&resp)) {
      ++seen->responses;
      auto take = [&](const v1::JobEvent& e) {
        seen->in_order = seen->in_order && e.sequence() > last;
        last = e.sequence();
        if (e.has_metrics() && e.metrics().has_rank()) {
          seen->rank_steps.push_back(e.metrics().step());
        }
        seen->ended_with_success =
            e.has_state_changed() && e.state_changed().state() == v1::JOB_STATE_SUCCEEDED;
      };
      take(resp.event());
      for (const v1::JobEvent& e : resp.more_events()) take(e);
    }
  };
  const auto began = std::chrono::steady_clock::now();
  grpc::ClientContext batched_ctx, single_ctx;
  auto batched = watch(batched_ctx, true);
  auto single = watch(single_ctx, false);
  Seen batched_seen, single_seen;
  std::thread batched_reader(read_all, batched.get(), &batched_seen);
  std::thread single_reader(read_all, single.get(), &single_seen);

  // 100 steps, one session message each, a millisecond apart: 200 events (the rank's sample
  // and the job-level one of its step). The job then succeeds while the last ones linger.
  constexpr int kSteps = 100;
  for (int step = 1; step <= kSteps; ++step) {
    v1::WorkerSessionRequest m;
    AddSample(&m, step);
    ASSERT_TRUE(worker_->Send(m));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  worker_->Exited(assigned_, 0);
  batched_reader.join();
  single_reader.join();
  const double elapsed_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
  EXPECT_TRUE(batched->Finish().ok());
  EXPECT_TRUE(single->Finish().ok());

  for (const Seen* seen : {&batched_seen, &single_seen}) {
    EXPECT_TRUE(seen->in_order);
    EXPECT_TRUE(seen->ended_with_success);
    ASSERT_EQ(seen->rank_steps.size(), static_cast<size_t>(kSteps));
    for (int i = 0; i < kSteps; ++i) EXPECT_EQ(seen->rank_steps[i], i + 1);
  }
  // Without batch_events: a response per event (≥ 200). With it: lingers of 5 ms follow one
  // another, so at most one write per 5 ms of the watch (~100 ms of messages: ~25; without
  // the linger, about one per message).
  EXPECT_GE(single_seen.responses, 2 * kSteps);
  EXPECT_LE(batched_seen.responses, elapsed_ms / 5 + 4)
      << "the events were not held for the ones behind (" << elapsed_ms << " ms)";
}

}  // namespace
}  // namespace meshrun::coordinator
