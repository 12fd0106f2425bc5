// The pp axis in the control plane (decision 0055): placement keeps tp, then cp, inside a worker
// and spreads a pipeline's stages across workers; the state database stores a rank's
// coordinates as the ordered list of axes and migrates a schema-1 folder; RankInfo carries the
// list; the Prometheus series carry the `pp` label, the stages' comm axis, the measured bubble
// and the job's world size.
#include <gtest/gtest.h>
#include <prometheus/metric_family.h>
#include <sqlite3.h>

#include <map>
#include <string>
#include <vector>

#include "coordinator/job_journal.h"
#include "coordinator/metrics_exporter.h"
#include "coordinator/metrics_ingest.h"
#include "coordinator/placement.h"
#include "coordinator/rank_series.h"
#include "coordinator/state_db.h"
#include "coordinator/step_aggregator.h"
#include "proto/mesh_axis.h"
#include "tests/coordinator/test_util.h"

namespace meshrun::coordinator {
namespace {

ParallelDims PpMesh(int p, int r, int s, int c, int t) {
  return *ParallelDims::Create(p, r, s, c, t);
}

std::vector<PlacementWorker> PpWorkers(const std::vector<int>& free) {
  std::vector<PlacementWorker> out;
  for (size_t i = 0; i < free.size(); ++i) {
    out.push_back({"w" + std::to_string(i), std::max(8, free[i]), free[i]});
  }
  return out;
}

// Whether every unit of `size` consecutive ranks sits on one worker.
bool PpUnitsWhole(const Placement& p, int size) {
  for (size_t begin = 0; begin < p.ranks.size(); begin += size) {
    for (size_t r = begin; r < begin + size && r < p.ranks.size(); ++r) {
      if (p.ranks[r].worker != p.ranks[begin].worker) return false;
    }
  }
  return true;
}

TEST(PipelinePlacementTest, EveryStageOnItsOwnWorkerWhenTheyFitNoWholeJob) {
  // pp 2 × tp 2 on two 2-slot workers (the cluster job of the issue): one stage per worker.
  StatusOr<Placement> p = PlaceJob(PpMesh(2, 1, 1, 1, 2), PpWorkers({2, 2}));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->ranks[0].worker, p->ranks[1].worker);
  EXPECT_EQ(p->ranks[2].worker, p->ranks[3].worker);
  EXPECT_NE(p->ranks[0].worker, p->ranks[2].worker);
  // pp 4 × dp_replicate 2 × tp 4 (32 ranks) on four 8-slot nodes: a stage per node, so only
  // the pipeline's sends cross nodes and dp_replicate's all-reduce stays inside one.
  StatusOr<Placement> q = PlaceJob(PpMesh(4, 2, 1, 1, 4), PpWorkers({8, 8, 8, 8}));
  ASSERT_TRUE(q.ok());
  EXPECT_TRUE(PpUnitsWhole(*q, 8));
  EXPECT_EQ(q->workers_used, 4);
}

TEST(PipelinePlacementTest, TpThenCpInsideAWorkerStagesAcrossExhaustively) {
  const std::vector<int> slot_choices = {0, 2, 3, 4, 6, 8};
  std::vector<std::vector<int>> layouts;
  for (int n = 1; n <= 3; ++n) {
    std::vector<int> idx(n, 0);
    while (true) {
      std::vector<int> layout;
      for (int i : idx) layout.push_back(slot_choices[i]);
      layouts.push_back(layout);
      int k = 0;
      while (k < n && ++idx[k] == static_cast<int>(slot_choices.size())) idx[k++] = 0;
      if (k == n) break;
    }
  }
  int checked = 0;
  for (int pp : {2, 3, 4}) {
    for (int r : {1, 2}) {
      for (int c : {1, 2}) {
        for (int t : {1, 2}) {
          const ParallelDims mesh = PpMesh(pp, r, 1, c, t);
          const int W = mesh.world_size(), stage = mesh.stage_size();
          if (W > 24) continue;
          for (const std::vector<int>& free : layouts) {
            SCOPED_TRACE(mesh.ToString() + " free=" + ::testing::PrintToString(free));
            int groups = 0, whole_stages = 0, largest = 0;
            bool caps_hold_cp = true, caps_hold_stages = true;
            for (int f : free) {
              groups += f / t;
              whole_stages += f / stage;
              largest = std::max(largest, f);
              caps_hold_cp &= (f / t) % c == 0;
              caps_hold_stages &= (f / t) % (stage / t) == 0;
            }
            StatusOr<Placement> p = PlaceJob(mesh, PpWorkers(free));
            if (groups < W / t) {
              EXPECT_FALSE(p.ok());
              continue;
            }
            ASSERT_TRUE(p.ok()) << p.status().ToString();
            ++checked;
            EXPECT_TRUE(PpUnitsWhole(*p, t)) << "a tp group spans workers";
            if (largest >= W) {
              EXPECT_EQ(p->workers_used, 1) << "the whole pipeline fits on one worker";
            } else if (whole_stages >= pp) {
              EXPECT_TRUE(PpUnitsWhole(*p, stage)) << "every stage fits whole somewhere";
            }
            if (caps_hold_cp) {
              EXPECT_TRUE(PpUnitsWhole(*p, c * t)) << "a cp group spans workers";
            }
            if (caps_hold_stages) {
              EXPECT_TRUE(PpUnitsWhole(*p, stage));
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

TEST(PipelinePlacementTest, APipelineWhoseTpGroupFitsNoWorkerIsRefusedNamingTheAxis) {
  const PlaceabilityVerdict v = CheckPlaceable(PpMesh(4, 1, 1, 1, 4), {2, 2, 2, 2, 2, 2, 2, 2});
  EXPECT_EQ(v.verdict, Placeability::kTpGroupTooLarge);
  EXPECT_EQ(v.message.rfind("parallelism.tp_size: a tp group of 4 ranks", 0), 0u) << v.message;
  EXPECT_NE(v.message.find("pipeline's stages spread across workers"), std::string::npos)
      << v.message;
  EXPECT_NE(v.message.find("(hint: "), std::string::npos);
  // Enough slots in all, in whole tp groups: placeable (it may wait for them to free up).
  EXPECT_EQ(CheckPlaceable(PpMesh(4, 1, 1, 1, 2), {2, 2, 2, 2}).verdict, Placeability::kPlaceable);
}

TEST(PipelineStateDbTest, CoordinatesAreStoredAsTheOrderedListOfAxes) {
  testing::TempDir dir;
  MeshCoords c;
  c.pp = 3;
  c.dp_replicate = 1;
  c.dp_shard = 2;
  c.tp = 1;
  {
    auto db = StateDb::Open(dir.path());
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    WriteBatch b;
    RankRow r;
    r.job_id = "job-1";
    r.attempt = 1;
    r.rank = 5;
    r.coords = c;
    b.ranks.push_back(r);
    ASSERT_TRUE((*db)->Commit(b, Durability::kDurable).ok());
  }
  auto db = StateDb::Open(dir.path());
  ASSERT_TRUE(db.ok());
  auto ranks = (*db)->LoadRanks("job-1", 1);
  ASSERT_TRUE(ranks.ok()) << ranks.status().ToString();
  ASSERT_EQ(ranks->size(), 1u);
  EXPECT_EQ((*ranks)[0].coords, c);
  db->reset();
  // On disk: one column, the mesh's own axes outermost first.
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() + "/coordinator.db").c_str(), &raw), SQLITE_OK);
  sqlite3_stmt* q = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(raw, "SELECT coords FROM ranks", -1, &q, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(q), SQLITE_ROW);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(sqlite3_column_text(q, 0))),
            "pp=3,dp_replicate=1,dp_shard=2,cp=0,tp=1");
  sqlite3_finalize(q);
  sqlite3_close(raw);
}

// A state folder written by a coordinator of schema version 1 (one column per axis).
void WriteSchemaOneDatabase(const std::string& path) {
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
  const char* sql = R"sql(
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta VALUES('schema_version', '1');
CREATE TABLE ranks(
  job_id TEXT NOT NULL, attempt INTEGER NOT NULL, rank INTEGER NOT NULL,
  worker_id TEXT NOT NULL, worker_name TEXT NOT NULL, local_rank INTEGER NOT NULL,
  local_world_size INTEGER NOT NULL, dp_replicate INTEGER NOT NULL, dp_shard INTEGER NOT NULL,
  cp INTEGER NOT NULL, tp INTEGER NOT NULL, state INTEGER NOT NULL, pid INTEGER NOT NULL,
  exit_code INTEGER NOT NULL, signal INTEGER NOT NULL, error TEXT NOT NULL,
  PRIMARY KEY(job_id, attempt, rank));
INSERT INTO ranks VALUES('job-000001', 2, 3, 'wkr-1', 'a', 1, 2, 1, 0, 1, 1, 4, 77, 3, 0, 'bad');
INSERT INTO ranks VALUES('job-000001', 2, 0, 'wkr-0', 'b', 0, 2, 0, 0, 0, 0, 3, 70, 0, 0, '');
)sql";
  char* err = nullptr;
  ASSERT_EQ(sqlite3_exec(raw, sql, nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
  sqlite3_close(raw);
}

TEST(PipelineStateDbTest, ASchemaOneFolderIsMigratedOnOpen) {
  testing::TempDir dir;
  WriteSchemaOneDatabase(dir.path() + "/coordinator.db");
  if (HasFatalFailure()) return;
  for (int open = 0; open < 2; ++open) {  // migrated once, then read as version 2
    auto db = StateDb::Open(dir.path());
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    auto ranks = (*db)->LoadRanks("job-000001", 2);
    ASSERT_TRUE(ranks.ok()) << ranks.status().ToString();
    ASSERT_EQ(ranks->size(), 2u + open);  // the second open also reads the row the first wrote
    const RankRow& r = (*ranks)[1];
    EXPECT_EQ(r.rank, 3);
    EXPECT_EQ(r.worker_name, "a");
    EXPECT_EQ(r.local_rank, 1);
    EXPECT_EQ(r.local_world_size, 2);
    EXPECT_EQ(r.coords, (MeshCoords{1, 0, 1, 1, 0}));  // r, s, c, t and pp 0
    EXPECT_EQ(r.state, 4);
    EXPECT_EQ(r.pid, 77);
    EXPECT_EQ(r.exit_code, 3);
    EXPECT_EQ(r.error, "bad");
    if (open == 1) {
      EXPECT_EQ((*ranks)[2].rank, 4);
      EXPECT_EQ((*ranks)[2].coords.pp, 1);
      break;
    }
    // New rows are written in the new shape beside the migrated ones.
    WriteBatch b;
    RankRow more = r;
    more.rank = 4;
    more.coords.pp = 1;
    b.ranks.push_back(more);
    ASSERT_TRUE((*db)->Commit(b, Durability::kDurable).ok());
  }
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() + "/coordinator.db").c_str(), &raw), SQLITE_OK);
  sqlite3_stmt* q = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(raw, "SELECT value FROM meta WHERE key = 'schema_version'", -1, &q,
                               nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(q), SQLITE_ROW);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(sqlite3_column_text(q, 0))), "2");
  sqlite3_finalize(q);
  sqlite3_close(raw);
}

TEST(PipelineStateDbTest, UnreadableCoordinatesAreAnErrorNotAGuess) {
  testing::TempDir dir;
  { ASSERT_TRUE(StateDb::Open(dir.path()).ok()); }
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() + "/coordinator.db").c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw,
                         "INSERT INTO ranks VALUES('job-1', 1, 0, 'w', 'w', 0, 1, "
                         "'pp=0,ep=1', 2, 0, 0, 0, '')",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(raw);
  auto db = StateDb::Open(dir.path());
  ASSERT_TRUE(db.ok());
  auto ranks = (*db)->LoadRanks("job-1", 1);
  ASSERT_FALSE(ranks.ok());
  EXPECT_NE(ranks.status().message().find("'pp=0,ep=1'"), std::string::npos)
      << ranks.status().ToString();
}

TEST(PipelineRankInfoTest, CarriesPpAndTheOrderedListOfAxes) {
  const ParallelDims mesh = PpMesh(2, 1, 2, 1, 2);
  RankRecord r;
  r.rank = 6;
  r.coords = mesh.CoordsOf(6);
  v1::RankInfo info;
  FillRankInfo(r, mesh, &info);
  EXPECT_EQ(info.coords().pp(), 1);
  EXPECT_EQ(info.coords().dp_shard(), 1);
  EXPECT_EQ(info.coords().tp(), 0);
  ASSERT_EQ(info.axes_size(), 5);
  const v1::MeshAxis order[] = {v1::MESH_AXIS_PP, v1::MESH_AXIS_DP_REPLICATE,
                                v1::MESH_AXIS_DP_SHARD, v1::MESH_AXIS_CP, v1::MESH_AXIS_TP};
  const int sizes[] = {2, 1, 2, 1, 2}, index[] = {1, 0, 1, 0, 0};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(info.axes(i).axis(), order[i]) << i;
    EXPECT_EQ(info.axes(i).size(), sizes[i]) << i;
    EXPECT_EQ(info.axes(i).index(), index[i]) << i;
  }
  // g = (((p·R + r)·S + s)·C + c)·T + t from the list alone.
  int g = 0;
  for (const v1::MeshAxisCoord& a : info.axes()) g = g * a.size() + a.index();
  EXPECT_EQ(g, 6);
}

v1::MetricsSample PpSample(int rank, int64_t step, double bubble) {
  v1::MetricsSample s;
  s.set_job_id("job-pp");
  s.set_attempt(1);
  s.set_rank(rank);
  s.set_step(step);
  s.set_step_seconds(0.05);
  s.set_pipeline_bubble_ratio(bubble);
  s.set_pipeline_bubble_theory(3.0 / 11);  // 1F1B, 4 stages, 8 micro-batches
  v1::CommStats* c = s.add_comm();
  c->set_axis(v1::MESH_AXIS_PP);
  c->set_op(v1::COMM_OP_SEND);
  c->set_seconds(0.01);
  c->set_bytes(2048);
  c->set_calls(4);
  return s;
}

std::map<std::string, std::string> PpLabelsOf(const prometheus::ClientMetric& m) {
  std::map<std::string, std::string> out;
  for (const auto& l : m.label) out[l.name] = l.value;
  return out;
}

TEST(PipelineMetricsTest, RankSeriesCarryPpTheBubbleAndTheStagesSends) {
  const ParallelDims mesh = PpMesh(2, 1, 1, 1, 2);
  RankSeries ranks;
  for (int rank = 0; rank < 4; ++rank) {
    RankLabels where;
    where.worker = "node-" + std::to_string(rank / 2);
    where.coords = mesh.CoordsOf(rank);
    where.device = "cpu";
    v1::MetricsSample s = PpSample(rank, 1, 0.1 * (rank + 1));
    ASSERT_EQ(MetricsIngest::Clean(&s), 0u) << "a pp entry is a series";
    ranks.Add(where, s);
  }
  JobsSnapshot snap;
  snap.jobs.push_back({"job-pp", "pipe", v1::JOB_STATE_RUNNING, 1, 100, 0.1, 1.0, 0});
  snap.jobs.back().world_size = 4;
  const auto families = MetricsExporter::Collect(snap, {}, &ranks);
  std::map<std::string, const prometheus::MetricFamily*> by_name;
  for (const auto& f : families) by_name[f.name] = &f;

  ASSERT_TRUE(by_name.count("meshrun_rank_pipeline_bubble_ratio"));
  const prometheus::MetricFamily& bubble = *by_name["meshrun_rank_pipeline_bubble_ratio"];
  ASSERT_EQ(bubble.metric.size(), 4u);
  for (const auto& m : bubble.metric) {
    const auto labels = PpLabelsOf(m);
    const int rank = std::stoi(labels.at("rank"));
    EXPECT_EQ(labels.at("pp"), std::to_string(rank / 2));
    EXPECT_EQ(labels.at("tp"), std::to_string(rank % 2));
    EXPECT_DOUBLE_EQ(m.gauge.value, 0.1 * (rank + 1));
  }
  // Beside the measurement, the schedule's theory (decision 0060), per rank with its stage.
  ASSERT_TRUE(by_name.count("meshrun_rank_pipeline_bubble_theory_ratio"));
  const prometheus::MetricFamily& theory = *by_name["meshrun_rank_pipeline_bubble_theory_ratio"];
  EXPECT_EQ(theory.type, prometheus::MetricType::Gauge);
  ASSERT_EQ(theory.metric.size(), 4u);
  for (const auto& m : theory.metric) {
    const auto labels = PpLabelsOf(m);
    EXPECT_EQ(labels.at("pp"), std::to_string(std::stoi(labels.at("rank")) / 2));
    EXPECT_DOUBLE_EQ(m.gauge.value, 3.0 / 11);
  }
  // Every per-rank series has the pp label beside the other coordinates.
  for (const auto& f : families) {
    if (f.name.rfind("meshrun_rank_", 0) != 0) continue;
    for (const auto& m : f.metric) EXPECT_TRUE(PpLabelsOf(m).count("pp")) << f.name;
  }
  int sends = 0;
  for (const auto& m : by_name["meshrun_rank_comm_bytes_total"]->metric) {
    const auto labels = PpLabelsOf(m);
    if (labels.at("axis") == "pp" && labels.at("op") == "send") {
      ++sends;
      EXPECT_DOUBLE_EQ(m.counter.value, 2048);
    }
  }
  EXPECT_EQ(sends, 4);
  ASSERT_TRUE(by_name.count("meshrun_job_world_size"));
  ASSERT_EQ(by_name["meshrun_job_world_size"]->metric.size(), 1u);
  EXPECT_DOUBLE_EQ(by_name["meshrun_job_world_size"]->metric[0].gauge.value, 4);
}

TEST(PipelineMetricsTest, ARankWithoutABubbleHasNoBubbleSeriesAndTheJobTakesTheLargest) {
  RankSeries ranks;
  v1::MetricsSample s = PpSample(0, 1, 0);
  s.clear_pipeline_bubble_ratio();
  s.clear_pipeline_bubble_theory();
  ranks.Add(RankLabels{"node-0", {}, "cpu", 0}, s);
  const auto families = MetricsExporter::Collect(JobsSnapshot{}, {}, &ranks);
  for (const auto& f : families) {
    if (f.name == "meshrun_rank_pipeline_bubble_ratio") {
      EXPECT_TRUE(f.metric.empty());
    }
    if (f.name == "meshrun_rank_pipeline_bubble_theory_ratio") {
      EXPECT_TRUE(f.metric.empty());
    }
  }
  StepAggregator agg(2, 64);
  EXPECT_FALSE(agg.Add(PpSample(0, 1, 0.25)).has_value());
  const std::optional<v1::MetricsSample> job = agg.Add(PpSample(1, 1, 0.5));
  ASSERT_TRUE(job.has_value());
  ASSERT_TRUE(job->has_pipeline_bubble_ratio());
  EXPECT_DOUBLE_EQ(job->pipeline_bubble_ratio(), 0.5);
  ASSERT_TRUE(job->has_pipeline_bubble_theory());
  EXPECT_DOUBLE_EQ(job->pipeline_bubble_theory(), 3.0 / 11);
  StepAggregator none(1, 64);
  v1::MetricsSample plain = PpSample(0, 1, 0);
  plain.clear_pipeline_bubble_ratio();
  plain.clear_pipeline_bubble_theory();
  const std::optional<v1::MetricsSample> plain_job = none.Add(plain);
  ASSERT_TRUE(plain_job.has_value());
  EXPECT_FALSE(plain_job->has_pipeline_bubble_ratio());
  EXPECT_FALSE(plain_job->has_pipeline_bubble_theory());
}

}  // namespace
}  // namespace meshrun::coordinator
