// The scheduling parts of JobManager without it: SlotBook's holders and foreign ranks,
// JobQueue's order, one SchedulingRound's FIFO decisions per device, Submit's admission check
// and the dry-run line.
#include "coordinator/scheduler.h"

#include <gtest/gtest.h>

namespace meshrun::coordinator {
namespace {

using std::chrono::milliseconds;

ParallelDims Mesh(int r, int s, int c, int t) {
  return ParallelDims::Create(r, s, c, t).value();
}

std::vector<LiveWorker> Workers(std::initializer_list<std::pair<const char*, int>> slots,
                                const std::string& device = "cpu") {
  std::vector<LiveWorker> out;
  for (const auto& [name, n] : slots) out.push_back({std::string("id-") + name, name, device, n});
  return out;
}

TEST(SlotBookTest, HoldersAndForeignRanksCountAsUsed) {
  SlotBook book;
  book.Occupy("w", {"job-1", 1, 0});
  book.Occupy("w", {"job-1", 1, 0});  // again: no change
  book.Occupy("w", {"job-1", 1, 1});
  book.SetForeign("w", 3);
  EXPECT_EQ(book.Used("w"), 5);
  EXPECT_EQ(book.Holders("w").size(), 2u);
  EXPECT_EQ(book.InUse().at("w"), 5);
  book.Release("w", {"job-1", 1, 0});
  book.SetForeign("w", 0);
  EXPECT_EQ(book.Used("w"), 1);
  EXPECT_EQ(book.WorkerIdsWithHolders(), std::vector<std::string_view>{"w"});
  book.Release("w", {"job-1", 1, 1});
  EXPECT_TRUE(book.WorkerIdsWithHolders().empty());
  EXPECT_TRUE(book.InUse().empty());
  EXPECT_EQ(book.Used("unknown"), 0);
}

TEST(JobQueueTest, OldestFirstAndCountedPerDevice) {
  JobQueue q;
  q.Add(3, "job-3", "cpu");
  q.Add(1, "job-1", "cuda");
  q.Add(2, "job-2", "cpu");
  EXPECT_EQ(q.InOrder(), (std::vector<std::string>{"job-1", "job-2", "job-3"}));
  EXPECT_EQ(q.CountFor("cpu"), 2);
  q.Remove(2);
  EXPECT_EQ(q.size(), 2u);
  EXPECT_EQ(q.CountFor("cpu"), 1);
}

TEST(SchedulingRoundTest, PlacesInFifoOrderAndTakesTheSlots) {
  SlotBook book;
  book.Occupy("id-a", {"job-0", 1, 0});  // 1 of a's 2 slots held
  SchedulingRound round(Workers({{"a", 2}, {"b", 2}}), book);
  ScheduleDecision first = round.Consider("job-1", "cpu", Mesh(1, 2, 1, 1), milliseconds(0));
  ASSERT_EQ(first.kind, ScheduleDecision::kPlace);
  EXPECT_EQ(first.placement.workers_used, 1);
  ASSERT_EQ(first.workers.size(), 2u);
  EXPECT_EQ(first.workers[first.placement.ranks[0].worker].name, "b") << "a has one free slot";
  // One free slot left (on a): a 2-rank job waits and blocks the cpu jobs behind it.
  ScheduleDecision second = round.Consider("job-2", "cpu", Mesh(1, 2, 1, 1), milliseconds(0));
  EXPECT_EQ(second.kind, ScheduleDecision::kWait);
  EXPECT_NE(second.message.find("waiting for slots to free up"), std::string::npos)
      << second.message;
  ScheduleDecision third = round.Consider("job-3", "cpu", Mesh(1, 1, 1, 1), milliseconds(0));
  EXPECT_EQ(third.kind, ScheduleDecision::kWait);
  EXPECT_EQ(third.message, "queued behind job job-2");
}

TEST(SchedulingRoundTest, WaitsThatDoNotBlockTheQueue) {
  SchedulingRound round(Workers({{"a", 2}}), SlotBook{});
  ScheduleDecision cuda = round.Consider("job-1", "cuda", Mesh(1, 1, 1, 1), milliseconds(0));
  EXPECT_EQ(cuda.kind, ScheduleDecision::kWait);
  EXPECT_NE(cuda.message.find("waiting for a cuda worker to register"), std::string::npos);
  ScheduleDecision backoff = round.Consider("job-2", "cpu", Mesh(1, 1, 1, 1), milliseconds(1500));
  EXPECT_EQ(backoff.kind, ScheduleDecision::kWait);
  EXPECT_EQ(backoff.message, "waiting out the restart backoff (1.5 s)");
  ScheduleDecision big = round.Consider("job-3", "cpu", Mesh(1, 4, 1, 1), milliseconds(0));
  EXPECT_EQ(big.kind, ScheduleDecision::kWait) << "waits for more workers";
  ScheduleDecision tp = round.Consider("job-4", "cpu", Mesh(1, 1, 1, 4), milliseconds(0));
  EXPECT_EQ(tp.kind, ScheduleDecision::kFail);
  EXPECT_NE(tp.message.find("parallelism.tp_size"), std::string::npos) << tp.message;
  // None of them blocked the cpu queue.
  EXPECT_EQ(round.Consider("job-5", "cpu", Mesh(1, 2, 1, 1), milliseconds(0)).kind,
            ScheduleDecision::kPlace);
}

TEST(CheckAdmissionTest, RefusesWhatCouldNeverStart) {
  const auto live = Workers({{"a", 2}, {"b", 2}});
  EXPECT_TRUE(CheckAdmission(live, "cpu", Mesh(1, 4, 1, 1), false).ok());
  EXPECT_TRUE(CheckAdmission(live, "cuda", Mesh(1, 64, 1, 1), false).ok())
      << "no cuda worker: it waits PENDING";
  Status tp = CheckAdmission(live, "cpu", Mesh(1, 1, 1, 4), true);
  EXPECT_EQ(tp.code(), StatusCode::kFailedPrecondition);
  Status big = CheckAdmission(live, "cpu", Mesh(1, 8, 1, 1), false);
  EXPECT_EQ(big.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(big.message().find("needs 8 slots but the 2 registered cpu workers hold 4 slots"),
            std::string::npos)
      << big.message();
  EXPECT_TRUE(CheckAdmission(live, "cpu", Mesh(1, 8, 1, 1), true).ok());
}

TEST(DescribeDryRunTest, NamesTheRanksOrWhatItWaitsFor) {
  const auto live = Workers({{"a", 2}, {"b", 2}});
  SlotBook book;
  EXPECT_EQ(DescribeDryRun(live, book, "cpu", Mesh(2, 2, 1, 1), 0),
            "would start now: ranks 0-1 on a, ranks 2-3 on b");
  EXPECT_EQ(DescribeDryRun(live, book, "cpu", Mesh(1, 1, 1, 1), 0), "would start now: rank 0 on a");
  EXPECT_EQ(DescribeDryRun(live, book, "cpu", Mesh(1, 1, 1, 1), 2),
            "would wait PENDING behind 2 queued cpu jobs");
  EXPECT_EQ(DescribeDryRun(live, book, "cuda", Mesh(1, 1, 1, 1), 0),
            "would wait PENDING for a cuda worker to register");
  book.Occupy("id-a", {"job-1", 1, 0});
  book.SetForeign("id-b", 2);
  const std::string busy = DescribeDryRun(live, book, "cpu", Mesh(1, 2, 1, 1), 0);
  EXPECT_EQ(busy.rfind("would wait PENDING: ", 0), 0u) << busy;
}

}  // namespace
}  // namespace meshrun::coordinator
