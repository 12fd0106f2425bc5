// CoordinatorServiceImpl's admission checks over real managers, a fake clock and fake streams:
// spec paths outside the cluster's roots are refused at SubmitJob (INVALID_ARGUMENT naming the
// field), and each limit answers RESOURCE_EXHAUSTED naming its flag: the submit rate per
// caller, the PENDING jobs, the spec size and the store value size.
#include <gtest/gtest.h>

#include <filesystem>

#include "coordinator/coordinator_service.h"
#include "tests/coordinator/test_util.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_streams.h"

namespace meshrun::coordinator {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using testing::FakeSessionStream;

using testing::Call;

bool Contains(const Status& s, const std::string& part) {
  return s.message().find(part) != std::string::npos;
}

class ServiceLimitsTest : public ::testing::Test {
 protected:
  // Builds the managers and the service; call once per test, after setting the knobs.
  void Build() {
    WorkerManagerConfig wcfg;
    wcfg.lease_ttl = milliseconds(1000);
    workers_ = std::make_unique<WorkerManager>(nullptr, clock_, wcfg);
    store_ = std::make_unique<StoreManager>(clock_, store_limits_);
    jcfg_.store_address = "coord:1";
    jobs_ = std::make_unique<JobManager>(nullptr, *workers_, *store_, clock_, jcfg_);
    service_ =
        std::make_unique<CoordinatorServiceImpl>(*jobs_, *workers_, *store_, clock_, options_);
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

  StatusOr<std::string> Submit(const v1::SubmitJobRequest& req, const std::string& caller = "") {
    v1::SubmitJobResponse resp;
    Status s = Call([&](ReplyCallback d) { service_->HandleSubmitJob(req, caller, &resp, d); });
    if (!s.ok()) return s;
    return resp.job_id();
  }

  v1::Job GetJob(const std::string& id) {
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::GetJobResponse resp;
    EXPECT_TRUE(Call([&](ReplyCallback d) { service_->HandleGetJob(req, &resp, d); }).ok());
    return resp.job();
  }

  int JobCount() {
    v1::ListJobsResponse resp;
    EXPECT_TRUE(Call([&](ReplyCallback d) {
                  service_->HandleListJobs(v1::ListJobsRequest(), &resp, d);
                }).ok());
    return resp.jobs_size();
  }

  testing::FakeClock clock_;
  StoreLimits store_limits_;
  JobManagerConfig jcfg_;
  ServiceOptions options_;
  std::unique_ptr<StoreManager> store_;
  std::unique_ptr<WorkerManager> workers_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<CoordinatorServiceImpl> service_;
};

class ConfinedSubmitTest : public ServiceLimitsTest {
 protected:
  void SetUp() override {
    fs::create_directories(dir_.path() + "/data");
    fs::create_directories(dir_.path() + "/ckpt");
    auto paths = PathPolicy::Create({dir_.path() + "/data"}, {dir_.path() + "/ckpt"});
    ASSERT_TRUE(paths.ok()) << paths.status().ToString();
    options_.paths = *paths;
    Build();
  }
  std::string Data() const { return fs::weakly_canonical(dir_.path() + "/data").string(); }
  std::string Ckpt() const { return fs::weakly_canonical(dir_.path() + "/ckpt").string(); }

  testing::TempDir dir_;
};

TEST_F(ConfinedSubmitTest, EscapingPathsAreRefusedWithTheFieldAndNoJobIsCreated) {
  struct Case {
    const char* field;
    std::function<void(v1::JobSpec&)> set;
  };
  const std::string outside = dir_.path() + "/elsewhere/x";
  const std::vector<Case> cases = {
      {"data.train", [&](v1::JobSpec& s) { s.mutable_data()->set_train("/etc/passwd"); }},
      {"data.val",
       [&](v1::JobSpec& s) { s.mutable_data()->set_val(Data() + "/../elsewhere/val.txt"); }},
      {"model.init_from", [&](v1::JobSpec& s) { s.mutable_model()->set_init_from(outside); }},
      {"checkpoint.dir", [&](v1::JobSpec& s) { s.mutable_checkpoint()->set_dir(Data() + "/c"); }},
  };
  for (const Case& c : cases) {
    v1::SubmitJobRequest req = testing::SubmitRequest(1, 1, 1, 1);
    req.mutable_spec()->mutable_data()->set_train(Data() + "/tiny.txt");
    c.set(*req.mutable_spec());
    StatusOr<std::string> id = Submit(req);
    ASSERT_FALSE(id.ok()) << c.field;
    EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument) << c.field;
    EXPECT_EQ(id.status().message().rfind(std::string(c.field) + ": ", 0), 0u)
        << id.status().message();
    EXPECT_TRUE(Contains(id.status(), "is outside the allowed")) << id.status().message();
    EXPECT_TRUE(Contains(id.status(), "(hint: ")) << id.status().message();
  }
  EXPECT_EQ(JobCount(), 0);
}

TEST_F(ConfinedSubmitTest, PathsInsideAreAcceptedAndRelativeOnesMadeAbsolute) {
  v1::SubmitJobRequest req = testing::SubmitRequest(1, 1, 1, 1);
  req.mutable_spec()->mutable_data()->set_train("corpus/tiny.txt");
  req.mutable_spec()->mutable_data()->set_val(Data() + "/val.txt");
  req.mutable_spec()->mutable_checkpoint()->set_dir("run-1");
  req.mutable_spec()->mutable_model()->clear_init_from();
  StatusOr<std::string> id = Submit(req);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  const v1::Job job = GetJob(*id);
  EXPECT_EQ(job.spec().data().train(), Data() + "/corpus/tiny.txt");
  EXPECT_EQ(job.spec().data().val(), Data() + "/val.txt");
  EXPECT_EQ(job.spec().checkpoint().dir(), Ckpt() + "/run-1");
}

TEST_F(ServiceLimitsTest, WithoutRootsAnyPathIsAccepted) {
  Build();
  v1::SubmitJobRequest req = testing::SubmitRequest(1, 1, 1, 1);
  req.mutable_spec()->mutable_data()->set_train("/etc/passwd");
  req.mutable_spec()->mutable_checkpoint()->set_dir("/tmp/anywhere");
  EXPECT_TRUE(Submit(req).ok());
}

TEST_F(ServiceLimitsTest, SubmitRateIsLimitedPerCaller) {
  options_.submit_rate = RateLimit{1, 2};
  Build();
  const v1::SubmitJobRequest req = testing::SubmitRequest(1, 1, 1, 1);
  EXPECT_TRUE(Submit(req, "ipv4:10.0.0.1").ok());
  EXPECT_TRUE(Submit(req, "ipv4:10.0.0.1").ok());
  StatusOr<std::string> third = Submit(req, "ipv4:10.0.0.1");
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(third.status().message().rfind("--submit-rate: ", 0), 0u) << third.status().message();
  EXPECT_TRUE(Contains(third.status(), "from ipv4:10.0.0.1")) << third.status().message();
  EXPECT_TRUE(Contains(third.status(), "retry in 1 s")) << third.status().message();
  // Another caller has its own bucket; time refills the first one's.
  EXPECT_TRUE(Submit(req, "ipv4:10.0.0.2").ok());
  clock_.Advance(milliseconds(1000));
  EXPECT_TRUE(Submit(req, "ipv4:10.0.0.1").ok());
  EXPECT_EQ(JobCount(), 4);
}

TEST_F(ServiceLimitsTest, PendingJobsAreLimited) {
  jcfg_.max_queued_jobs = 2;
  Build();  // no workers: every job stays PENDING
  const v1::SubmitJobRequest req = testing::SubmitRequest(1, 1, 1, 1);
  StatusOr<std::string> first = Submit(req);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(Submit(req).ok());
  StatusOr<std::string> third = Submit(req);
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(third.status().message().rfind("--max-pending-jobs: 2 jobs", 0), 0u)
      << third.status().message();
  // Cancelling one makes room.
  v1::CancelJobRequest cancel;
  cancel.set_job_id(*first);
  v1::CancelJobResponse cancelled;
  ASSERT_TRUE(
      Call([&](ReplyCallback d) { service_->HandleCancelJob(cancel, &cancelled, d); }).ok());
  EXPECT_TRUE(Submit(req).ok());
}

TEST_F(ServiceLimitsTest, OversizedSpecIsRefused) {
  jcfg_.max_spec_bytes = 4096;
  Build();
  v1::SubmitJobRequest req = testing::SubmitRequest(1, 1, 1, 1);
  req.mutable_spec()->set_source_yaml(std::string(3000, '#'));
  EXPECT_TRUE(Submit(req).ok());
  req.mutable_spec()->set_source_yaml(std::string(5000, '#'));
  StatusOr<std::string> big = Submit(req);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(big.status(), "over the 4096 of the coordinator's --max-spec-bytes"))
      << big.status().message();
}

TEST_F(ServiceLimitsTest, OversizedStoreValueIsRefused) {
  store_limits_.max_value_bytes = 1024;
  Build();
  Connect("a", 1);
  StatusOr<std::string> id = Submit(testing::SubmitRequest(1, 1, 1, 1));
  ASSERT_TRUE(id.ok());
  v1::StoreSetRequest set;
  set.set_job_id(*id);
  set.set_attempt(1);
  set.set_key("k");
  set.set_value(std::string(1024, 'v'));
  v1::StoreSetResponse resp;
  EXPECT_TRUE(Call([&](ReplyCallback d) { service_->HandleStoreSet(set, &resp, d); }).ok());
  set.set_value(std::string(1025, 'v'));
  Status s = Call([&](ReplyCallback d) { service_->HandleStoreSet(set, &resp, d); });
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(s, "--max-store-value-bytes")) << s.message();
}

}  // namespace
}  // namespace meshrun::coordinator
