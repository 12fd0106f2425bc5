// CoordinatorServiceImpl over real managers (fake clock and streams, no sockets) with a few
// hundred workers: ListWorkers pages (in name order, each within its size, the state filter
// applied before paging; page_size 0 as before paging) and the session lock of WorkerManager,
// which every session message takes and no query does.
#include <gtest/gtest.h>

#include <future>

#include "coordinator/coordinator_service.h"
#include "tests/coordinator/test_util.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_streams.h"

namespace meshrun::coordinator {
namespace {

using testing::Call;
using testing::FakeSessionStream;

constexpr int kPagedWorkers = 300;

class WorkerPagesTest : public ::testing::Test {
 protected:
  WorkerPagesTest() {
    WorkerManagerConfig wcfg;
    wcfg.lease_ttl = std::chrono::milliseconds(60'000);
    workers_ = std::make_unique<WorkerManager>(nullptr, clock_, wcfg);
    JobManagerConfig jcfg;
    jcfg.store_address = "coord:1";
    jobs_ = std::make_unique<JobManager>(nullptr, *workers_, store_, clock_, jcfg);
    service_ = std::make_unique<CoordinatorServiceImpl>(*jobs_, *workers_, store_, clock_);
    for (int i = 0; i < kPagedWorkers; ++i) {
      char name[16];
      std::snprintf(name, sizeof(name), "node-%03d", i);
      streams_.push_back(Connect(name, 8));
    }
  }

  std::shared_ptr<FakeSessionStream> Connect(const std::string& name, int slots) {
    v1::RegisterWorkerRequest req;
    req.set_name(name);
    req.set_slots(slots);
    req.set_device("cpu");
    req.set_address("127.0.0.1");
    v1::RegisterWorkerResponse resp;
    EXPECT_TRUE(Call([&](ReplyCallback d) { service_->HandleRegisterWorker(req, &resp, d); }).ok());
    auto stream = std::make_shared<FakeSessionStream>();
    v1::WorkerSessionRequest open;
    open.mutable_open()->set_worker_id(resp.worker_id());
    open.mutable_open()->set_session_token(resp.session_token());
    service_->HandleWorkerSessionRequest(stream, open);
    return stream;
  }

  // Every page of `req`, each checked against its size.
  std::vector<v1::WorkerInfo> AllPages(v1::ListWorkersRequest req, int* pages) {
    std::vector<v1::WorkerInfo> out;
    for (int n = 0; n < 1000; ++n) {
      v1::ListWorkersResponse resp;
      EXPECT_TRUE(Call([&](ReplyCallback d) { service_->HandleListWorkers(req, &resp, d); }).ok());
      EXPECT_LE(resp.workers_size(), req.page_size());
      ++*pages;
      for (const auto& w : resp.workers()) out.push_back(w);
      if (resp.next_page_token().empty()) break;
      req.set_page_token(resp.next_page_token());
    }
    return out;
  }

  testing::FakeClock clock_;
  StoreManager store_{clock_, StoreLimits{}};
  std::unique_ptr<WorkerManager> workers_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<CoordinatorServiceImpl> service_;
  std::vector<std::shared_ptr<FakeSessionStream>> streams_;
};

TEST_F(WorkerPagesTest, PagesInNameOrderWithinTheirSize) {
  v1::ListWorkersRequest req;
  req.set_page_size(7);
  int pages = 0;
  const std::vector<v1::WorkerInfo> all = AllPages(req, &pages);
  ASSERT_EQ(all.size(), static_cast<size_t>(kPagedWorkers));
  EXPECT_EQ(pages, (kPagedWorkers + 6) / 7);
  for (int i = 0; i < kPagedWorkers; ++i) {
    char name[16];
    std::snprintf(name, sizeof(name), "node-%03d", i);
    EXPECT_EQ(all[i].name(), name);
  }
  // page_size 0: every worker in one answer, no token (clients from before paging).
  v1::ListWorkersRequest old;
  v1::ListWorkersResponse resp;
  ASSERT_TRUE(Call([&](ReplyCallback d) { service_->HandleListWorkers(old, &resp, d); }).ok());
  EXPECT_EQ(resp.workers_size(), kPagedWorkers);
  EXPECT_TRUE(resp.next_page_token().empty());
  // A token this coordinator did not issue.
  req.set_page_token("node-001");
  EXPECT_EQ(Call([&](ReplyCallback d) { service_->HandleListWorkers(req, &resp, d); }).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(WorkerPagesTest, TheStateFilterAppliesBeforePaging) {
  // A 16-rank job: two workers BUSY, the rest READY.
  v1::SubmitJobResponse submitted;
  auto submit = testing::SubmitRequest(1, 2, 1, 8);
  ASSERT_TRUE(
      Call([&](ReplyCallback d) { service_->HandleSubmitJob(submit, &submitted, d); }).ok());
  v1::ListWorkersRequest req;
  req.set_page_size(1);
  req.add_states(v1::WORKER_STATE_BUSY);
  int pages = 0;
  const std::vector<v1::WorkerInfo> busy = AllPages(req, &pages);
  ASSERT_EQ(busy.size(), 2u);
  for (const auto& w : busy) EXPECT_EQ(w.slots_in_use(), 8);
  EXPECT_LE(pages, 3);
  req.set_page_size(50);
  req.clear_states();
  req.add_states(v1::WORKER_STATE_READY);
  pages = 0;
  EXPECT_EQ(AllPages(req, &pages).size(), static_cast<size_t>(kPagedWorkers - 2));
}

// Deterministic, no timing: the test thread holds the session lock (so a heartbeat is stuck in
// Touch), and ListWorkers and SubmitJob still answer on another thread.
TEST_F(WorkerPagesTest, QueriesAnswerWhileTheSessionLockIsHeld) {
  std::unique_lock<std::mutex> held = workers_->HoldSessionsForTest();
  std::thread heartbeat([&] {
    v1::WorkerSessionRequest beat;
    beat.mutable_heartbeat();
    service_->HandleWorkerSessionRequest(streams_[0], beat);  // waits in Touch
  });
  auto queries = std::async(std::launch::async, [&] {
    v1::ListWorkersRequest req;
    req.set_page_size(100);
    v1::ListWorkersResponse page;
    const bool listed =
        Call([&](ReplyCallback d) { service_->HandleListWorkers(req, &page, d); }).ok() &&
        page.workers_size() == 100;
    v1::SubmitJobResponse submitted;
    auto submit = testing::SubmitRequest(1, 2, 1, 8);
    const bool accepted =
        Call([&](ReplyCallback d) { service_->HandleSubmitJob(submit, &submitted, d); }).ok();
    return listed && accepted;
  });
  ASSERT_EQ(queries.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "a query waited for the session lock";
  EXPECT_TRUE(queries.get());
  held.unlock();
  heartbeat.join();
}

}  // namespace
}  // namespace meshrun::coordinator
