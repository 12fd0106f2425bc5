// The rank-sample tier recycles the events it lets go of (JobEventLog::SpareRankSampleEvent):
// a recycled event filled with a sample holds that sample and nothing of the one before, and
// the tier's byte count stays the sum of what it holds.
#include <gtest/gtest.h>

#include <deque>
#include <string>

#include "coordinator/job_events.h"

namespace meshrun::coordinator {
namespace {

v1::MetricsSample Sample(int rank, int step, const std::string& job_id) {
  v1::MetricsSample s;
  s.set_job_id(job_id);
  s.set_rank(rank);
  s.set_step(step);
  s.set_loss(1.0 / (1 + step));
  for (int i = 0; i < (rank % 4 == 0 ? 5 : rank % 2); ++i) {
    v1::CommStats* c = s.add_comm();
    c->set_axis(v1::MESH_AXIS_DP_SHARD);
    c->set_op(v1::COMM_OP_ALL_GATHER);
    c->set_bytes(1000 * (i + 1));
  }
  return s;
}

TEST(EventLogTest, RecycledRankSampleEventsHoldTheirSampleOnlyAndTheByteCountStaysExact) {
  EventLimits limits;
  limits.rank_metrics = 3;
  JobEventLog log("job-1", 1, limits);
  EXPECT_FALSE(log.SpareRankSampleEvent().has_metrics());  // nothing evicted yet: a new one
  std::deque<size_t> sizes;                                // of the events the tier should hold
  bool recycled = false;
  for (int i = 0; i < 12; ++i) {
    v1::JobEvent event = log.SpareRankSampleEvent();
    recycled = recycled || event.has_metrics();
    // A long string and many comm entries, then short ones and fewer: a recycled event must
    // not keep what it held.
    const v1::MetricsSample sample =
        Sample(i, 100 + i, i % 4 == 0 ? std::string(300, 'x') : "job-1");
    *event.mutable_metrics() = sample;
    log.Stamp(&event, WallTime{});
    ASSERT_EQ(event.metrics().SerializeAsString(), sample.SerializeAsString()) << "sample " << i;
    sizes.push_back(event.ByteSizeLong());
    if (sizes.size() > 3) sizes.pop_front();
    log.Publish(std::move(event));
    size_t expected = 0;
    for (size_t s : sizes) expected += s;
    EXPECT_EQ(log.retained_bytes(), expected) << "after sample " << i;
    EXPECT_EQ(log.retained_count(), sizes.size());
  }
  EXPECT_TRUE(recycled);
  log.ReleaseRankMetrics();
  EXPECT_EQ(log.retained_bytes(), 0u);
  EXPECT_FALSE(log.SpareRankSampleEvent().has_metrics());  // released with the tier
}

}  // namespace
}  // namespace meshrun::coordinator
