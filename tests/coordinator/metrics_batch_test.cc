// Batched rank samples on the session (RankMetrics.samples, decision 0063) through
// CoordinatorServiceImpl with real managers and fake streams: the coordinator says it takes
// them, a batch is ingested as its samples one by one (the job-level sample of a step
// completes from batches), a sample of a rank placed on another worker is dropped without the
// rest of its batch, and a batch over kMaxMetricsBatch or with a sample missing its rank ends
// the session naming the field.
#include <gtest/gtest.h>

#include "coordinator/coordinator_service.h"
#include "tests/coordinator/coordinator_fixture.h"
#include "tests/coordinator/test_util.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_streams.h"

namespace meshrun::coordinator {
namespace {

using testing::Call;
using testing::FakeSessionStream;
using testing::FakeWatchStream;

class MetricsBatchTest : public CoordinatorServiceFixture {
 protected:
  // A 4-rank job on two 2-slot workers, every rank started; the ranks each worker got.
  std::string RunningJob(const std::shared_ptr<FakeSessionStream>& a,
                         const std::shared_ptr<FakeSessionStream>& b, std::vector<int>* ranks_a,
                         std::vector<int>* ranks_b) {
    v1::SubmitJobResponse resp;
    auto req = testing::SubmitRequest(1, 2, 1, 2);
    EXPECT_TRUE(Call([&](ReplyCallback d) { service_->HandleSubmitJob(req, &resp, d); }).ok());
    jobs_->FlushAssignments();
    for (auto [stream, out] : {std::pair{a, ranks_a}, std::pair{b, ranks_b}}) {
      for (const auto& m : stream->sent(v1::WorkerSessionResponse::kAssign)) {
        out->push_back(m.assign().rank());
        v1::WorkerSessionRequest up;
        up.mutable_rank_started()->set_job_id(resp.job_id());
        up.mutable_rank_started()->set_attempt(1);
        up.mutable_rank_started()->set_rank(m.assign().rank());
        up.mutable_rank_started()->set_pid(42);
        service_->HandleWorkerSessionRequest(stream, up);
      }
    }
    return resp.job_id();
  }

  std::shared_ptr<FakeWatchStream> Watch(const std::string& job_id) {
    v1::WatchJobRequest wreq;
    wreq.set_job_id(job_id);
    wreq.set_rank_metrics(true);
    auto watch = std::make_shared<FakeWatchStream>();
    service_->HandleWatchJob(wreq, watch);
    return watch;
  }
};

void AddBatchSample(v1::RankMetrics* m, const std::string& job_id, int rank, int step) {
  v1::MetricsSample* s = m->add_samples();
  s->set_job_id(job_id);
  s->set_attempt(1);
  s->set_rank(rank);
  s->set_step(step);
  s->set_step_seconds(0.5);
  s->set_loss(2.0);
}

// Rank samples and job-level samples among the watcher's events.
std::pair<int, int> CountSamples(const std::vector<v1::JobEvent>& events) {
  int rank = 0, job = 0;
  for (const auto& e : events) {
    if (!e.has_metrics()) continue;
    (e.metrics().has_rank() ? rank : job) += 1;
  }
  return {rank, job};
}

TEST_F(MetricsBatchTest, ABatchIsIngestedAsItsSamples) {
  auto a = Connect("a", 2);
  auto b = Connect("b", 2);
  const auto accepted = a->sent(v1::WorkerSessionResponse::kAccepted);
  ASSERT_EQ(accepted.size(), 1u);
  EXPECT_TRUE(accepted[0].accepted().metrics_batches());
  std::vector<int> ranks_a, ranks_b;
  const std::string id = RunningJob(a, b, &ranks_a, &ranks_b);
  ASSERT_EQ(ranks_a.size(), 2u);
  ASSERT_EQ(ranks_b.size(), 2u);
  auto watch = Watch(id);
  const size_t before = watch->events().size();

  // Worker a: its two samples of step 1 in one message, plus one of b's rank (forged: dropped).
  v1::WorkerSessionRequest up_a;
  for (int r : ranks_a) AddBatchSample(up_a.mutable_metrics(), id, r, 1);
  AddBatchSample(up_a.mutable_metrics(), id, ranks_b[0], 1);
  service_->HandleWorkerSessionRequest(a, up_a);
  EXPECT_FALSE(a->finished().has_value());
  std::vector<v1::JobEvent> events = watch->events();
  events.erase(events.begin(), events.begin() + static_cast<long>(before));
  EXPECT_EQ(CountSamples(events), std::make_pair(2, 0));  // step 1 not complete: b's are missing

  // Worker b: one sample in the old form (`sample`) and one in `samples`, in one message.
  v1::WorkerSessionRequest up_b;
  v1::MetricsSample* single = up_b.mutable_metrics()->mutable_sample();
  single->set_job_id(id);
  single->set_attempt(1);
  single->set_rank(ranks_b[0]);
  single->set_step(1);
  single->set_step_seconds(0.5);
  AddBatchSample(up_b.mutable_metrics(), id, ranks_b[1], 1);
  service_->HandleWorkerSessionRequest(b, up_b);
  EXPECT_FALSE(b->finished().has_value());
  events = watch->events();
  events.erase(events.begin(), events.begin() + static_cast<long>(before));
  EXPECT_EQ(CountSamples(events), std::make_pair(4, 1));  // every rank once, the step complete
}

TEST_F(MetricsBatchTest, ABatchTooLargeOrWithoutARankEndsTheSession) {
  auto a = Connect("a", 2);
  v1::WorkerSessionRequest large;
  for (int i = 0; i <= CoordinatorServiceImpl::kMaxMetricsBatch; ++i) {
    AddBatchSample(large.mutable_metrics(), "job-1", 0, i + 1);
  }
  service_->HandleWorkerSessionRequest(a, large);
  ASSERT_TRUE(a->finished().has_value());
  EXPECT_EQ(a->finished()->code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(a->finished()->message().rfind("metrics.samples: 257 samples", 0), 0u)
      << a->finished()->message();

  auto b = Connect("b", 2);
  v1::WorkerSessionRequest no_rank;
  AddBatchSample(no_rank.mutable_metrics(), "job-1", 0, 1);
  no_rank.mutable_metrics()->mutable_samples(0)->clear_rank();
  service_->HandleWorkerSessionRequest(b, no_rank);
  ASSERT_TRUE(b->finished().has_value());
  EXPECT_EQ(b->finished()->code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b->finished()->message().rfind("metrics.samples.rank", 0), 0u)
      << b->finished()->message();

  // An empty RankMetrics is still a missing sample, as before batches.
  auto c = Connect("c", 2);
  v1::WorkerSessionRequest empty;
  empty.mutable_metrics();
  service_->HandleWorkerSessionRequest(c, empty);
  ASSERT_TRUE(c->finished().has_value());
  EXPECT_EQ(c->finished()->message().rfind("metrics.sample.rank", 0), 0u);
}

// A heartbeat riding on a batch (RankMetrics.heartbeat, decision 0070) is handled after the
// samples exactly as a heartbeat message: a running rank of an attempt the coordinator does not
// count gets a stop order, and a list over --max-ranks-per-report ends the session.
TEST_F(MetricsBatchTest, AHeartbeatOnABatchIsHandledAsAHeartbeat) {
  auto a = Connect("a", 2);
  auto b = Connect("b", 2);
  EXPECT_TRUE(a->sent(v1::WorkerSessionResponse::kAccepted)[0].accepted().heartbeat_with_metrics());
  std::vector<int> ranks_a, ranks_b;
  const std::string id = RunningJob(a, b, &ranks_a, &ranks_b);
  auto watch = Watch(id);
  const size_t before = watch->events().size();
  const size_t stops = a->sent(v1::WorkerSessionResponse::kStop).size();

  v1::WorkerSessionRequest up;
  for (int r : ranks_a) AddBatchSample(up.mutable_metrics(), id, r, 1);
  v1::Heartbeat* beat = up.mutable_metrics()->mutable_heartbeat();
  for (int r : ranks_a) {
    v1::RunningRank* rr = beat->add_running();
    rr->set_job_id(id);
    rr->set_attempt(1);
    rr->set_rank(r);
  }
  v1::RunningRank* stray = beat->add_running();  // a rank of an attempt nobody placed here
  stray->set_job_id("job-404");
  stray->set_attempt(1);
  stray->set_rank(0);
  service_->HandleWorkerSessionRequest(a, up);
  EXPECT_FALSE(a->finished().has_value());
  std::vector<v1::JobEvent> events = watch->events();
  events.erase(events.begin(), events.begin() + static_cast<long>(before));
  EXPECT_EQ(CountSamples(events).first, 2);  // the samples went in
  const auto stop_orders = a->sent(v1::WorkerSessionResponse::kStop);
  ASSERT_EQ(stop_orders.size(), stops + 1);  // and the heartbeat was read
  EXPECT_EQ(stop_orders.back().stop().job_id(), "job-404");

  v1::WorkerSessionRequest too_many;
  AddBatchSample(too_many.mutable_metrics(), id, ranks_b[0], 2);
  for (int i = 0; i < 4'097; ++i) {
    v1::RunningRank* rr = too_many.mutable_metrics()->mutable_heartbeat()->add_running();
    rr->set_job_id("job-404");
    rr->set_attempt(1);
    rr->set_rank(i);
  }
  service_->HandleWorkerSessionRequest(b, too_many);
  ASSERT_TRUE(b->finished().has_value());
  EXPECT_EQ(b->finished()->code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(b->finished()->message().rfind("--max-ranks-per-report: metrics.heartbeat.running", 0),
            0u)
      << b->finished()->message();
}

}  // namespace
}  // namespace meshrun::coordinator
