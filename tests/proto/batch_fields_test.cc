// The fields decision 0063 appended for batched rank samples and watch events, and decision 0070
// for a heartbeat on a batch: their numbers and types (the highest of their messages, so older
// peers skip them as unknown fields), and a batch that round-trips.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include "meshrun/v1/coordinator.pb.h"
#include "meshrun/v1/worker.pb.h"

namespace meshrun::v1 {
namespace {

using google::protobuf::FieldDescriptor;

void ExpectField(const google::protobuf::Descriptor* d, const char* name, int number,
                 FieldDescriptor::Type type, bool repeated, bool highest = true) {
  const FieldDescriptor* f = d->FindFieldByName(name);
  ASSERT_NE(f, nullptr) << d->full_name() << "." << name;
  EXPECT_EQ(f->number(), number) << f->full_name();
  EXPECT_EQ(f->type(), type) << f->full_name();
  EXPECT_EQ(f->is_repeated(), repeated) << f->full_name();
  // Appended: the highest number of its message (until a later field was appended after it).
  if (!highest) return;
  for (int i = 0; i < d->field_count(); ++i) EXPECT_LE(d->field(i)->number(), number);
}

TEST(BatchFields, AppendedWithTheirNumbers) {
  // Decision 0063's, then 0070's appended after them.
  ExpectField(RankMetrics::descriptor(), "samples", 2, FieldDescriptor::TYPE_MESSAGE, true,
              /*highest=*/false);
  ExpectField(SessionAccepted::descriptor(), "metrics_batches", 3, FieldDescriptor::TYPE_BOOL,
              false, /*highest=*/false);
  ExpectField(RankMetrics::descriptor(), "heartbeat", 3, FieldDescriptor::TYPE_MESSAGE, false);
  ExpectField(SessionAccepted::descriptor(), "heartbeat_with_metrics", 4,
              FieldDescriptor::TYPE_BOOL, false);
  EXPECT_EQ(RankMetrics::descriptor()->FindFieldByName("heartbeat")->message_type(),
            Heartbeat::descriptor());
  ExpectField(WatchJobRequest::descriptor(), "batch_events", 8, FieldDescriptor::TYPE_BOOL, false);
  ExpectField(WatchJobResponse::descriptor(), "more_events", 2, FieldDescriptor::TYPE_MESSAGE,
              true);
  EXPECT_EQ(RankMetrics::descriptor()->FindFieldByName("samples")->message_type(),
            MetricsSample::descriptor());
  EXPECT_EQ(WatchJobResponse::descriptor()->FindFieldByName("more_events")->message_type(),
            JobEvent::descriptor());
}

TEST(BatchFields, ABatchRoundTrips) {
  WorkerSessionRequest m;
  RankMetrics* batch = m.mutable_metrics();
  batch->mutable_sample()->set_rank(0);
  for (int r = 1; r <= 7; ++r) {
    MetricsSample* s = batch->add_samples();
    s->set_job_id("job-000001");
    s->set_attempt(1);
    s->set_rank(r);
    s->set_step(3);
  }
  WorkerSessionRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(m.SerializeAsString()));
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(m, parsed));
}

}  // namespace
}  // namespace meshrun::v1
