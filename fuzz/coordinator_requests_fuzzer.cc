// Fuzz target: the coordinator's request handlers (coordinator/coordinator_service.h) over its
// real managers and a real StateDb in a fresh temporary state folder, called directly (no
// gRPC). The input is a sequence of records
//   [op byte][arg byte][length: 2 bytes, little-endian][length bytes of serialized protobuf]
// (at most 64 records). Each op builds a plausible request -- the ids of jobs submitted and
// workers registered earlier in the sequence, a valid spec whose mesh the arg byte picks, the
// ranks the coordinator assigned to a session -- and then merges the payload into it
// (protobuf MergeFromString: set fields override, so the fuzzer can reach every field while
// still producing requests that get past the first checks). Ops: SubmitJob, GetJob, ListJobs,
// CancelJob, StoreSet, StoreGet (with and without wait), StoreAdd, RegisterWorker, a worker
// session message (open, heartbeat, rank started/exited, metrics, logs, checkpoint saved),
// session closed, ListWorkers, GetJobLogs, WatchJob, and Tick after moving the fake clock.
//
// Properties: no crash, UB, leak or hang; every unary call answers (StoreGet waits by
// Shutdown at the latest), exactly once; no answer is INTERNAL or UNKNOWN; a SubmitJob that
// was answered OK returns a job id that GetJob finds; and after the sequence, new managers
// over the same state folder Load it and still find every job whose submission was answered
// OK (a submit is durable once acknowledged).
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/coordinator_service.h"
#include "coordinator/job_manager.h"
#include "coordinator/state_db.h"
#include "coordinator/store_manager.h"
#include "coordinator/worker_manager.h"
#include "fuzz/fuzz_check.h"
#include "tests/coordinator/test_util.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_streams.h"

namespace {

namespace fs = std::filesystem;
using meshrun::Status;
using meshrun::StatusCode;
namespace coord = meshrun::coordinator;
namespace v1 = meshrun::v1;

std::string ScratchBase() {
  if (const char* t = std::getenv("MESHRUN_FUZZ_TMPDIR")) return t;
  std::error_code ec;
  if (fs::is_directory("/dev/shm", ec)) return "/dev/shm";  // fsyncs stay in memory
  return fs::temp_directory_path().string();
}

// MESHRUN_FUZZ_TRACE=1: print every call and its answer (to check what a seed reaches).
bool Trace() {
  static const bool trace = std::getenv("MESHRUN_FUZZ_TRACE") != nullptr;
  return trace;
}

// Answers of unary calls: each must come exactly once and never be INTERNAL/UNKNOWN.
struct Answers {
  struct Slot {
    std::optional<Status> status;
    int calls = 0;
    const char* method = "";
  };
  std::deque<Slot> slots;

  coord::ReplyCallback Expect(const char* method) {
    slots.push_back({});
    Slot* slot = &slots.back();  // deque: stable addresses
    slot->method = method;
    return [slot](const Status& s) {
      ++slot->calls;
      FUZZ_CHECK(slot->calls == 1, std::string(slot->method) + " answered twice");
      slot->status = s;
      if (Trace()) std::fprintf(stderr, "  %s -> %s\n", slot->method, s.ToString().c_str());
      FUZZ_CHECK(s.code() != StatusCode::kInternal && s.code() != StatusCode::kUnknown,
                 std::string(slot->method) + ": " + s.message());
    };
  }
};

// A WatchJob stream that keeps `capacity` events, then, as the contract in
// coordinator/streams.h says (and the gRPC adapter does), ends itself with UNAVAILABLE and
// refuses the event. (tests/fakes' FakeWatchStream only refuses, which left streams open here.)
class WatchStream final : public coord::WatchJobStream {
 public:
  explicit WatchStream(size_t capacity) : capacity_(capacity) {}
  bool Send(const v1::WatchJobResponse&) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return false;
    if (sent_ >= capacity_) {
      finished_ = meshrun::UnavailableError("the client fell too far behind");
      return false;
    }
    ++sent_;
    return true;
  }
  void Finish(const Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!finished_) finished_ = status;
  }
  bool finished() const {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_.has_value();
  }

 private:
  mutable std::mutex mu_;
  size_t capacity_;
  size_t sent_ = 0;
  std::optional<Status> finished_;
};

struct Session {
  std::shared_ptr<meshrun::testing::FakeSessionStream> stream;
  std::string worker_id, token;
};

// One coordinator (managers + service) over the state folder `dir`.
struct Coordinator {
  explicit Coordinator(const std::string& dir, const meshrun::testing::FakeClock& clock)
      : store(clock, coord::StoreLimits{}) {
    auto opened = coord::StateDb::Open(dir);
    FUZZ_CHECK(opened.ok(), "StateDb::Open: " + opened.status().message());
    db = std::move(*opened);
    coord::WorkerManagerConfig wcfg;
    wcfg.lease_ttl = std::chrono::milliseconds(2000);
    workers = std::make_unique<coord::WorkerManager>(db.get(), clock, wcfg);
    coord::JobManagerConfig jcfg;
    jcfg.store_address = "coordinator:1";
    jcfg.max_queued_jobs = 32;
    jobs = std::make_unique<coord::JobManager>(db.get(), *workers, store, clock, jcfg);
    service = std::make_unique<coord::CoordinatorServiceImpl>(*jobs, *workers, store, clock);
    Status s = workers->Load();
    FUZZ_CHECK(s.ok(), "WorkerManager::Load: " + s.message());
    s = jobs->Load();
    FUZZ_CHECK(s.ok(), "JobManager::Load: " + s.message());
  }
  ~Coordinator() { service->Shutdown(); }

  std::unique_ptr<coord::StateDb> db;
  coord::StoreManager store;
  std::unique_ptr<coord::WorkerManager> workers;
  std::unique_ptr<coord::JobManager> jobs;
  std::unique_ptr<coord::CoordinatorServiceImpl> service;
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::string Bytes(size_t n) {
    n = std::min(n, size_ - pos_);
    std::string out(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

template <typename T>
const std::string& Pick(const std::vector<T>& items, uint8_t arg) {
  return items[arg % items.size()];
}

// The assignments the coordinator sent on `stream`, newest last.
std::vector<v1::RankAssignment> Assigned(const Session& session) {
  std::vector<v1::RankAssignment> out;
  for (const auto& m : session.stream->sent(v1::WorkerSessionResponse::kAssign)) {
    out.push_back(m.assign());
  }
  return out;
}

void RunSequence(Reader& in, Coordinator& c, meshrun::testing::FakeClock& clock,
                 std::vector<std::string>& acknowledged) {
  Answers answers;
  // Responses must outlive calls answered later (StoreGet with wait): keep them all.
  std::deque<std::unique_ptr<google::protobuf::Message>> responses;
  auto keep = [&](auto* response) {
    responses.emplace_back(response);
    return response;
  };
  std::vector<std::string> job_ids = {"job-unknown"};
  std::vector<Session> sessions;
  std::vector<std::shared_ptr<WatchStream>> watches;
  coord::CoordinatorServiceImpl& svc = *c.service;

  for (int record = 0; record < 64 && !in.done(); ++record) {
    const uint8_t op = in.Byte();
    const uint8_t arg = in.Byte();
    const size_t length = in.Byte() | (static_cast<size_t>(in.Byte()) << 8);
    const std::string payload = in.Bytes(length);
    if (Trace()) {
      std::fprintf(stderr, "record %d: op %d arg 0x%02x, %zu payload bytes\n", record, op % 15, arg,
                   payload.size());
    }
    switch (op % 15) {
      case 0: {  // SubmitJob: a valid spec, mesh from arg, then the payload
        v1::SubmitJobRequest req = meshrun::testing::SubmitRequest(
            1 + (arg & 1), 1 + ((arg >> 1) & 1), 1 + ((arg >> 2) & 1), 1 + ((arg >> 3) & 3),
            (arg >> 5) & 3);
        (void)req.MergeFromString(payload);
        auto* resp = keep(new v1::SubmitJobResponse);
        svc.HandleSubmitJob(req, resp, answers.Expect("SubmitJob"));
        if (answers.slots.back().status && answers.slots.back().status->ok() && req.dry_run()) {
          // A dry run stores nothing: no job id, a placement answer instead.
          FUZZ_CHECK(resp->job_id().empty(), "a dry run returned a job id: " + resp->job_id());
          FUZZ_CHECK(!resp->placement().empty(), "a dry run without a placement answer");
        } else if (answers.slots.back().status && answers.slots.back().status->ok()) {
          FUZZ_CHECK(!resp->job_id().empty(), "SubmitJob OK without a job id");
          if (std::find(job_ids.begin(), job_ids.end(), resp->job_id()) == job_ids.end()) {
            job_ids.push_back(resp->job_id());
          }
          acknowledged.push_back(resp->job_id());
          v1::GetJobRequest get;
          get.set_job_id(resp->job_id());
          auto* got = keep(new v1::GetJobResponse);
          svc.HandleGetJob(get, got, answers.Expect("GetJob after SubmitJob"));
          FUZZ_CHECK(answers.slots.back().status && answers.slots.back().status->ok(),
                     "a submitted job is not found: " + resp->job_id());
        }
        break;
      }
      case 1: {
        v1::GetJobRequest req;
        req.set_job_id(Pick(job_ids, arg));
        (void)req.MergeFromString(payload);
        svc.HandleGetJob(req, keep(new v1::GetJobResponse), answers.Expect("GetJob"));
        break;
      }
      case 2: {
        v1::ListJobsRequest req;
        (void)req.MergeFromString(payload);
        svc.HandleListJobs(req, keep(new v1::ListJobsResponse), answers.Expect("ListJobs"));
        break;
      }
      case 3: {
        v1::CancelJobRequest req;
        req.set_job_id(Pick(job_ids, arg));
        (void)req.MergeFromString(payload);
        svc.HandleCancelJob(req, keep(new v1::CancelJobResponse), answers.Expect("CancelJob"));
        break;
      }
      case 4: {
        v1::StoreSetRequest req;
        req.set_job_id(Pick(job_ids, arg));
        req.set_attempt(1 + (arg >> 6));
        req.set_key("k" + std::to_string(arg & 7));
        req.set_value("v");
        (void)req.MergeFromString(payload);
        svc.HandleStoreSet(req, keep(new v1::StoreSetResponse), answers.Expect("StoreSet"));
        break;
      }
      case 5: {
        v1::StoreGetRequest req;
        req.set_job_id(Pick(job_ids, arg));
        req.set_attempt(1 + (arg >> 6));
        req.set_key("k" + std::to_string(arg & 7));
        req.set_wait(arg & 8);
        (void)req.MergeFromString(payload);
        std::optional<coord::WallTime> deadline;
        if (arg & 16) deadline = clock.Now() + std::chrono::milliseconds(100 * (arg & 32 ? 50 : 1));
        svc.HandleStoreGet(req, keep(new v1::StoreGetResponse), deadline,
                           answers.Expect("StoreGet"));
        break;
      }
      case 6: {
        v1::StoreAddRequest req;
        req.set_job_id(Pick(job_ids, arg));
        req.set_attempt(1 + (arg >> 6));
        req.set_key("k" + std::to_string(arg & 7));
        req.set_delta(1);
        (void)req.MergeFromString(payload);
        svc.HandleStoreAdd(req, keep(new v1::StoreAddResponse), answers.Expect("StoreAdd"));
        break;
      }
      case 7: {  // RegisterWorker
        v1::RegisterWorkerRequest req;
        req.set_name("w" + std::to_string(arg & 3));
        req.set_slots(1 + ((arg >> 2) & 7));
        req.set_device("cpu");
        req.set_address("127.0.0.1");
        (void)req.MergeFromString(payload);
        auto* resp = keep(new v1::RegisterWorkerResponse);
        svc.HandleRegisterWorker(req, resp, answers.Expect("RegisterWorker"));
        if (answers.slots.back().status && answers.slots.back().status->ok()) {
          sessions.push_back({std::make_shared<meshrun::testing::FakeSessionStream>(),
                              resp->worker_id(), resp->session_token()});
        }
        break;
      }
      case 8: {  // a session message on a registered worker's stream
        if (sessions.empty()) break;
        Session& s = sessions[arg % sessions.size()];
        const auto assigned = Assigned(s);
        const v1::RankAssignment* a =
            assigned.empty() ? nullptr : &assigned[(arg >> 3) % assigned.size()];
        v1::WorkerSessionRequest req;
        switch ((arg >> 4) % 8) {
          case 0:
            req.mutable_open()->set_worker_id(s.worker_id);
            req.mutable_open()->set_session_token(s.token);
            break;
          case 1:
            req.mutable_heartbeat();
            for (const auto& r : assigned) {
              auto* run = req.mutable_heartbeat()->add_running();
              run->set_job_id(r.job_id());
              run->set_attempt(r.attempt());
              run->set_rank(r.rank());
              run->set_pid(100 + r.rank());
            }
            break;
          case 2:
            if (a) {
              req.mutable_rank_started()->set_job_id(a->job_id());
              req.mutable_rank_started()->set_attempt(a->attempt());
              req.mutable_rank_started()->set_rank(a->rank());
              req.mutable_rank_started()->set_pid(100 + a->rank());
            }
            break;
          case 3:
            if (a) {
              req.mutable_rank_exited()->set_job_id(a->job_id());
              req.mutable_rank_exited()->set_attempt(a->attempt());
              req.mutable_rank_exited()->set_rank(a->rank());
              req.mutable_rank_exited()->set_exit_code(arg & 1);
            }
            break;
          case 4:
            if (a) {
              auto* sample = req.mutable_metrics()->mutable_sample();
              sample->set_job_id(a->job_id());
              sample->set_attempt(a->attempt());
              sample->set_rank(a->rank());
            }
            break;
          case 5:
            if (a) {
              auto* line = req.mutable_logs()->add_lines();
              line->set_job_id(a->job_id());
              line->set_attempt(a->attempt());
              line->set_rank(a->rank());
              line->set_text("log line");
            }
            break;
          case 6:
            if (a) {
              req.mutable_checkpoint_saved()->set_job_id(a->job_id());
              req.mutable_checkpoint_saved()->set_attempt(a->attempt());
              req.mutable_checkpoint_saved()->set_step(1);
              req.mutable_checkpoint_saved()->set_path("/ckpt/step-00000001");
            }
            break;
          default: break;
        }
        (void)req.MergeFromString(payload);
        svc.HandleWorkerSessionRequest(s.stream, req);
        if (Trace()) {
          std::fprintf(stderr, "  session %s: %s; %zu assignments so far%s\n", s.worker_id.c_str(),
                       req.ShortDebugString().c_str(), Assigned(s).size(),
                       s.stream->finished()
                           ? (", finished: " + s.stream->finished()->ToString()).c_str()
                           : "");
        }
        break;
      }
      case 9: {  // the session stream ends; the worker may open a new one later
        if (sessions.empty()) break;
        Session& s = sessions[arg % sessions.size()];
        svc.HandleWorkerSessionClosed(s.stream);
        s.stream = std::make_shared<meshrun::testing::FakeSessionStream>();
        break;
      }
      case 10: {
        v1::ListWorkersRequest req;
        (void)req.MergeFromString(payload);
        svc.HandleListWorkers(req, keep(new v1::ListWorkersResponse),
                              answers.Expect("ListWorkers"));
        break;
      }
      case 11: {
        v1::GetJobLogsRequest req;
        req.set_job_id(Pick(job_ids, arg));
        (void)req.MergeFromString(payload);
        svc.HandleGetJobLogs(req, keep(new v1::GetJobLogsResponse), answers.Expect("GetJobLogs"));
        break;
      }
      case 12: {
        v1::WatchJobRequest req;
        req.set_job_id(Pick(job_ids, arg));
        req.set_replay_only(arg & 1);
        (void)req.MergeFromString(payload);
        auto stream = std::make_shared<WatchStream>(arg & 2 ? 4 : SIZE_MAX);
        watches.push_back(stream);
        svc.HandleWatchJob(req, stream);
        break;
      }
      default: {  // time passes (up to ~25 s, past lease expiry), then the ticker runs
        clock.Advance(std::chrono::milliseconds(100 * static_cast<int>(arg)));
        svc.Tick();
        break;
      }
    }
  }
  svc.Shutdown();
  for (const auto& slot : answers.slots) {
    FUZZ_CHECK(slot.calls == 1, std::string(slot.method) + " never answered");
  }
  for (const auto& w : watches) {
    FUZZ_CHECK(w->finished(), "a WatchJob stream is still open after Shutdown");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static int counter = 0;
  const std::string dir = ScratchBase() + "/meshrun-fuzz-coord-" + std::to_string(::getpid()) +
                          "-" + std::to_string(counter++ % 2);
  std::error_code ec;
  fs::remove_all(dir, ec);
  meshrun::testing::FakeClock clock;
  std::vector<std::string> acknowledged;
  {
    Coordinator c(dir, clock);
    Reader in(data, size);
    RunSequence(in, c, clock, acknowledged);
  }
  {
    // A restart: what was acknowledged is still there.
    Coordinator c(dir, clock);
    for (const std::string& id : acknowledged) {
      auto job = c.jobs->Get(id);
      FUZZ_CHECK(job.ok(), "job " + id + " lost across a restart: " + job.status().message());
    }
  }
  fs::remove_all(dir, ec);
  return 0;
}
