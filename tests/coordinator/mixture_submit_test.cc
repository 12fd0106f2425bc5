// A submitted mixture (data.train as a list, docs/data.md "Mixtures") under the cluster's data
// roots: every source's path is confined like data.train (a source outside is refused naming
// data.train[i], and no job is created) and a relative one is made absolute against its root.
#include <gtest/gtest.h>

#include <filesystem>

#include "coordinator/coordinator_service.h"
#include "tests/coordinator/test_util.h"
#include "tests/fakes/fake_clock.h"

namespace meshrun::coordinator {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using testing::Call;

class MixtureSubmitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(dir_.path() + "/data");
    fs::create_directories(dir_.path() + "/ckpt");
    auto paths = PathPolicy::Create({dir_.path() + "/data"}, {dir_.path() + "/ckpt"});
    ASSERT_TRUE(paths.ok()) << paths.status().ToString();
    options_.paths = *paths;
    WorkerManagerConfig wcfg;
    wcfg.lease_ttl = milliseconds(1000);
    workers_ = std::make_unique<WorkerManager>(nullptr, clock_, wcfg);
    store_ = std::make_unique<StoreManager>(clock_, StoreLimits{});
    JobManagerConfig jcfg;
    jcfg.store_address = "coord:1";
    jobs_ = std::make_unique<JobManager>(nullptr, *workers_, *store_, clock_, jcfg);
    service_ =
        std::make_unique<CoordinatorServiceImpl>(*jobs_, *workers_, *store_, clock_, options_);
  }

  std::string Data() const { return fs::weakly_canonical(dir_.path() + "/data").string(); }

  v1::SubmitJobRequest MixtureRequest(const std::string& a, const std::string& b) {
    v1::SubmitJobRequest req = testing::SubmitRequest(1, 1, 1, 1);
    req.mutable_spec()->mutable_data()->clear_train();
    v1::DataSource* first = req.mutable_spec()->mutable_data()->add_train_sources();
    first->set_path(a);
    first->set_weight(0.7);
    v1::DataSource* second = req.mutable_spec()->mutable_data()->add_train_sources();
    second->set_path(b);
    second->set_weight(0.3);
    req.mutable_spec()->mutable_checkpoint()->set_dir("run-1");
    req.mutable_spec()->mutable_model()->clear_init_from();
    return req;
  }

  StatusOr<v1::Job> Submit(const v1::SubmitJobRequest& req) {
    v1::SubmitJobResponse resp;
    Status s = Call([&](ReplyCallback d) { service_->HandleSubmitJob(req, "", &resp, d); });
    if (!s.ok()) return s;
    v1::GetJobRequest get;
    get.set_job_id(resp.job_id());
    v1::GetJobResponse job;
    EXPECT_TRUE(Call([&](ReplyCallback d) { service_->HandleGetJob(get, &job, d); }).ok());
    return job.job();
  }

  int JobCount() {
    v1::ListJobsResponse resp;
    EXPECT_TRUE(Call([&](ReplyCallback d) {
                  service_->HandleListJobs(v1::ListJobsRequest(), &resp, d);
                }).ok());
    return resp.jobs_size();
  }

  testing::FakeClock clock_;
  ServiceOptions options_;
  std::unique_ptr<StoreManager> store_;
  std::unique_ptr<WorkerManager> workers_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<CoordinatorServiceImpl> service_;
  testing::TempDir dir_;
};

TEST_F(MixtureSubmitTest, ASourceOutsideTheRootsIsRefusedNamingIt) {
  StatusOr<v1::Job> job = Submit(MixtureRequest("web.bin", "/etc/passwd"));
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(job.status().message().rfind("data.train[1]: /etc/passwd is outside the allowed", 0),
            0u)
      << job.status().message();
  EXPECT_EQ(JobCount(), 0);
}

TEST_F(MixtureSubmitTest, SourcesInsideAreAcceptedAndMadeAbsolute) {
  StatusOr<v1::Job> job = Submit(MixtureRequest("web.bin", Data() + "/code"));
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  const v1::DataSpec& data = job->spec().data();
  EXPECT_EQ(data.train(), "");
  ASSERT_EQ(data.train_sources_size(), 2);
  EXPECT_EQ(data.train_sources(0).path(), Data() + "/web.bin");
  EXPECT_EQ(data.train_sources(0).weight(), 0.7);
  EXPECT_EQ(data.train_sources(1).path(), Data() + "/code");
}

}  // namespace
}  // namespace meshrun::coordinator
