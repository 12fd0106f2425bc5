// JobManager at a few hundred ranks (tests/coordinator/job_manager_fixture.h: fakes, a real
// SQLite file): the job summary without ranks, ListRanks pages and filters (each page bounded
// by its size and its bytes), the ingest path's lock never taken by a query, the heartbeat
// fast path still seeing every change, and a large placement persisted across a restart.
#include <gtest/gtest.h>

#include <future>
#include <set>

#include "tests/coordinator/job_manager_fixture.h"

namespace meshrun::coordinator {
namespace {

constexpr int kWorkers = 64;
constexpr int kSlots = 8;
constexpr int kRanks = kWorkers * kSlots;  // 512: dp_replicate 4 × dp_shard 16 × tp 8

class QueriesAtScaleTest : public JobManagerTest {
 protected:
  void AddWorkers(int n, int first = 0) {
    for (int i = first; i < first + n; ++i) {
      char name[16];
      std::snprintf(name, sizeof(name), "w%03d", i);
      workers_.Add(name, kSlots);
    }
  }
  std::string SubmitLarge() {
    AddWorkers(kWorkers);
    const std::string id = Submit(4, 16, 1, 8);
    EXPECT_FALSE(id.empty());
    return id;
  }
  v1::GetJobResponse Summary(const std::string& id) {
    v1::GetJobRequest req;
    req.set_job_id(id);
    req.set_summary(true);
    v1::GetJobResponse resp;
    EXPECT_TRUE(jobs_->Get(req, &resp).ok());
    return resp;
  }
  static int Count(const v1::GetJobResponse& resp, v1::RankState state) {
    for (const auto& c : resp.rank_states()) {
      if (c.state() == state) return c.ranks();
    }
    return 0;
  }
  // Every page of `req`, checking each against its size and bytes.
  std::vector<v1::RankInfo> AllPages(v1::ListRanksRequest req, int* pages = nullptr) {
    std::vector<v1::RankInfo> out;
    for (int n = 0; n < 10'000; ++n) {
      v1::ListRanksResponse resp;
      const Status s = jobs_->ListRanks(req, &resp);
      EXPECT_TRUE(s.ok()) << s.ToString();
      if (!s.ok()) break;
      const int limit = req.page_size() == 0 ? 100 : req.page_size();
      EXPECT_LE(resp.ranks_size(), limit);
      // The ranks, their tags and lengths within the byte limit (the token and attempt beside).
      EXPECT_LE(resp.ByteSizeLong(), max_page_bytes_ + 64);
      if (pages != nullptr) ++*pages;
      for (const auto& r : resp.ranks()) out.push_back(r);
      if (resp.next_page_token().empty()) break;
      req.set_page_token(resp.next_page_token());
    }
    return out;
  }
};

TEST_F(QueriesAtScaleTest, SummaryHasNoRanksButCountsThem) {
  const std::string id = SubmitLarge();
  v1::GetJobResponse summary = Summary(id);
  EXPECT_EQ(summary.job().ranks_size(), 0);
  EXPECT_EQ(summary.job().world_size(), kRanks);
  EXPECT_EQ(Count(summary, v1::RANK_STATE_ASSIGNED), kRanks);
  EXPECT_EQ(summary.workers_used(), kWorkers);
  // Half the workers start their ranks: the counts follow without a pass over the ranks.
  for (int i = 0; i < kWorkers / 2; ++i) {
    char name[16];
    std::snprintf(name, sizeof(name), "w%03d", i);
    StartAll(name);
  }
  summary = Summary(id);
  EXPECT_EQ(Count(summary, v1::RANK_STATE_RUNNING), kRanks / 2);
  EXPECT_EQ(Count(summary, v1::RANK_STATE_ASSIGNED), kRanks / 2);
  // Old clients (no summary flag) still get every rank.
  EXPECT_EQ(Get(id).ranks_size(), kRanks);
}

TEST_F(QueriesAtScaleTest, PagesCoverEveryRankOnceInOrderAndStayWithinTheirSize) {
  const std::string id = SubmitLarge();
  v1::ListRanksRequest req;
  req.set_job_id(id);
  req.set_page_size(100);
  int pages = 0;
  const std::vector<v1::RankInfo> ranks = AllPages(req, &pages);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kRanks));
  EXPECT_EQ(pages, 6);
  for (int i = 0; i < kRanks; ++i) EXPECT_EQ(ranks[i].rank(), i);
  // The default page, and a page_size above the maximum capped at it.
  req.set_page_size(0);
  v1::ListRanksResponse resp;
  ASSERT_TRUE(jobs_->ListRanks(req, &resp).ok());
  EXPECT_EQ(resp.ranks_size(), 100);
  req.set_page_size(1'000'000);
  resp.Clear();
  ASSERT_TRUE(jobs_->ListRanks(req, &resp).ok());
  EXPECT_EQ(resp.ranks_size(), kRanks);  // ≤ the maximum of 1000
}

TEST_F(QueriesAtScaleTest, APageEndsBeforeItsByteLimit) {
  max_page_bytes_ = 2000;
  Open();
  const std::string id = SubmitLarge();
  v1::ListRanksRequest req;
  req.set_job_id(id);
  req.set_page_size(1000);
  int pages = 0;
  const std::vector<v1::RankInfo> ranks = AllPages(req, &pages);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kRanks));
  EXPECT_GT(pages, 5);  // ~30 bytes a rank: about 60 a page, far fewer than 1000
  for (int i = 0; i < kRanks; ++i) EXPECT_EQ(ranks[i].rank(), i);
}

TEST_F(QueriesAtScaleTest, FiltersByStateWorkerAndCoordinates) {
  const std::string id = SubmitLarge();
  for (int i = 0; i < kWorkers; i += 2) {
    char name[16];
    std::snprintf(name, sizeof(name), "w%03d", i);
    StartAll(name);
  }
  const v1::Job full = Get(id);
  auto expect_same = [&](const v1::ListRanksRequest& req, auto pred) {
    std::vector<int> want;
    for (const auto& r : full.ranks()) {
      if (pred(r)) want.push_back(r.rank());
    }
    std::vector<int> got;
    for (const auto& r : AllPages(req)) got.push_back(r.rank());
    EXPECT_EQ(got, want);
    EXPECT_FALSE(want.empty());
  };
  v1::ListRanksRequest req;
  req.set_job_id(id);
  req.set_page_size(7);
  req.add_states(v1::RANK_STATE_RUNNING);
  expect_same(req, [](const v1::RankInfo& r) { return r.state() == v1::RANK_STATE_RUNNING; });

  req.clear_states();
  req.set_worker("w005");  // by name
  expect_same(req, [](const v1::RankInfo& r) { return r.worker_name() == "w005"; });
  req.set_worker("w006");  // the fake's ids are the names too; a started worker's ranks
  req.add_states(v1::RANK_STATE_RUNNING);
  expect_same(req, [](const v1::RankInfo& r) { return r.worker_id() == "w006"; });

  req.clear_states();
  req.clear_worker();
  req.mutable_coords()->set_dp_shard(3);
  req.mutable_coords()->set_tp(5);
  expect_same(req, [](const v1::RankInfo& r) {
    return r.coords().dp_shard() == 3 && r.coords().tp() == 5;
  });
  req.mutable_coords()->clear_tp();
  req.mutable_coords()->set_dp_replicate(2);
  req.add_states(v1::RANK_STATE_ASSIGNED);
  expect_same(req, [](const v1::RankInfo& r) {
    return r.coords().dp_shard() == 3 && r.coords().dp_replicate() == 2 &&
           r.state() == v1::RANK_STATE_ASSIGNED;
  });

  // The list form (MeshCoordsFilter.axes, what the CLI's --where sends besides the fields):
  // the same ranks; an axis in both forms must agree.
  req.clear_coords();
  req.clear_states();
  auto fix = [&](v1::MeshAxis axis, int index) {
    v1::MeshAxisCoord* a = req.mutable_coords()->add_axes();
    a->set_axis(axis);
    a->set_index(index);
  };
  fix(v1::MESH_AXIS_DP_SHARD, 3);
  fix(v1::MESH_AXIS_TP, 5);
  expect_same(req, [](const v1::RankInfo& r) {
    return r.coords().dp_shard() == 3 && r.coords().tp() == 5;
  });
  req.mutable_coords()->set_tp(5);
  expect_same(req, [](const v1::RankInfo& r) {
    return r.coords().dp_shard() == 3 && r.coords().tp() == 5;
  });
  v1::ListRanksResponse resp;
  req.mutable_coords()->set_tp(4);
  Status contradiction = jobs_->ListRanks(req, &resp);
  EXPECT_EQ(contradiction.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(contradiction.message().find("coords.axes[1]: tp=5 contradicts coords.tp=4"),
            std::string::npos)
      << contradiction.message();
  req.clear_coords();
  fix(v1::MESH_AXIS_DP_CP, 0);  // a group, not one of the mesh's own axes
  EXPECT_EQ(jobs_->ListRanks(req, &resp).code(), StatusCode::kInvalidArgument);
  req.clear_coords();
  fix(v1::MESH_AXIS_TP, 8);
  EXPECT_EQ(jobs_->ListRanks(req, &resp).code(), StatusCode::kInvalidArgument);

  // Out of the mesh, and a token this coordinator did not issue: INVALID_ARGUMENT.
  req.clear_coords();
  req.mutable_coords()->set_tp(8);
  EXPECT_EQ(jobs_->ListRanks(req, &resp).code(), StatusCode::kInvalidArgument);
  req.clear_coords();
  req.set_page_token("r12");
  EXPECT_EQ(jobs_->ListRanks(req, &resp).code(), StatusCode::kInvalidArgument);
  req.set_page_token("a2r12");  // an attempt the job has not (yet) run
  EXPECT_EQ(jobs_->ListRanks(req, &resp).code(), StatusCode::kAborted);
}

// Deterministic, no timing: the test thread holds the job's ingest lock (a rank sample is then
// stuck in the ingest path), and every query still answers on another thread.
TEST_F(QueriesAtScaleTest, QueriesAnswerWhileTheIngestPathHoldsItsLock) {
  const std::string id = SubmitLarge();
  StartAll("w000");
  std::shared_ptr<JobIngest> ingest = jobs_->IngestOf(id);
  ASSERT_NE(ingest, nullptr);
  std::unique_lock<std::mutex> held(ingest->mu);
  auto heartbeat_lock = jobs_->HoldHeartbeatCacheForTest();
  std::thread sample([&] {
    v1::RankMetrics m;
    m.mutable_sample()->set_job_id(id);
    m.mutable_sample()->set_attempt(1);
    m.mutable_sample()->set_rank(0);
    m.mutable_sample()->set_step(1);
    jobs_->OnRankMetrics("w000", m);  // waits for the ingest lock
  });
  AddWorkers(2, kWorkers);  // room for a second job
  auto queries = std::async(std::launch::async, [&] {
    v1::GetJobResponse summary = Summary(id);
    v1::ListRanksRequest req;
    req.set_job_id(id);
    req.set_page_size(500);
    v1::ListRanksResponse page;
    const bool listed = jobs_->ListRanks(req, &page).ok() && page.ranks_size() == 500;
    const bool submitted = !Submit(1, 2, 1, 8).empty();
    const bool slots = jobs_->SlotsInUseOf({"w000", "w064"}) == std::vector<int>{8, 8};
    return summary.job().ranks_size() == 0 && listed && submitted && slots;
  });
  ASSERT_EQ(queries.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "a query waited for the ingest path's lock";
  EXPECT_TRUE(queries.get());
  heartbeat_lock.unlock();
  held.unlock();
  sample.join();
}

// The fast path answers a repeated heartbeat without mu_, but never hides a change: a rank
// missing from the list, or an attempt that ended, is acted on as before.
TEST_F(QueriesAtScaleTest, CachedHeartbeatsStillSeeChanges) {
  AddWorkers(2);
  const std::string id = Submit(1, 2, 1, 8);
  const auto ranks = StartAll("w000");
  ASSERT_EQ(ranks.size(), 8u);
  const auto ranks1 = StartAll("w001");
  ASSERT_EQ(ranks1.size(), 8u);
  for (int i = 0; i < 3; ++i) Heartbeat("w000", ranks);  // cached from the second on
  for (int i = 0; i < 3; ++i) Heartbeat("w001", ranks1);
  // Rank 3 disappears from the list: LOST after max_missed_reports (2) reports.
  std::vector<v1::RankAssignment> fewer = ranks;
  fewer.erase(fewer.begin() + 3);
  Heartbeat("w000", fewer);
  Heartbeat("w000", fewer);
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_FAILED);
  // w001's list was cached while the attempt ran; the attempt ended since, so the same list
  // now earns its StopOrder again once the resend interval passed (a stale cache would not).
  const auto others = workers_.TakeAssignments("w001");  // none left: StartAll took them
  EXPECT_TRUE(others.empty());
  (void)workers_.TakeStops("w001");
  clock_.Advance(std::chrono::milliseconds(2000));
  Heartbeat("w001", ranks1);
  EXPECT_FALSE(workers_.TakeStops("w001").empty());
}

TEST_F(QueriesAtScaleTest, LargePlacementIsPersistedAndSurvivesARestart) {
  const std::string id = SubmitLarge();
  StartAll("w001");
  Open();  // a coordinator restart over the same database
  v1::GetJobResponse summary = Summary(id);
  EXPECT_EQ(summary.job().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(summary.workers_used(), kWorkers);
  EXPECT_EQ(Count(summary, v1::RANK_STATE_RUNNING), kSlots);
  EXPECT_EQ(Count(summary, v1::RANK_STATE_ASSIGNED), kRanks - kSlots);
  v1::ListRanksRequest req;
  req.set_job_id(id);
  req.set_page_size(1000);
  const std::vector<v1::RankInfo> ranks = AllPages(req);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kRanks));
  std::set<std::string> workers;
  for (int i = 0; i < kRanks; ++i) {
    EXPECT_EQ(ranks[i].rank(), i);
    workers.insert(ranks[i].worker_id());
  }
  EXPECT_EQ(workers.size(), static_cast<size_t>(kWorkers));
}

}  // namespace
}  // namespace meshrun::coordinator
