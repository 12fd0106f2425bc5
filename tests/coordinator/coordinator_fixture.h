// The fixture of the CoordinatorServiceImpl tests (coordinator_service_test.cc,
// metrics_batch_test.cc): the service over real managers, a fake clock and fake streams (no
// sockets), with helpers for what a worker and a client send.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/coordinator_service.h"
#include "tests/coordinator/test_util.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_streams.h"

namespace meshrun::coordinator {

class CoordinatorServiceFixture : public ::testing::Test {
 protected:
  CoordinatorServiceFixture() {
    WorkerManagerConfig wcfg;
    wcfg.lease_ttl = std::chrono::milliseconds(1000);
    workers_ = std::make_unique<WorkerManager>(nullptr, clock_, wcfg);
    JobManagerConfig jcfg;
    jcfg.store_address = "coord:1";
    jobs_ = std::make_unique<JobManager>(nullptr, *workers_, store_, clock_, jcfg);
    service_ = std::make_unique<CoordinatorServiceImpl>(*jobs_, *workers_, store_, clock_);
  }

  // Registers and opens a session; returns the stream.
  std::shared_ptr<testing::FakeSessionStream> Connect(const std::string& name, int slots) {
    v1::RegisterWorkerRequest req;
    req.set_name(name);
    req.set_slots(slots);
    req.set_device("cpu");
    req.set_address("127.0.0.1");
    v1::RegisterWorkerResponse resp;
    EXPECT_TRUE(testing::Call([&](ReplyCallback d) {
                  service_->HandleRegisterWorker(req, &resp, d);
                }).ok());
    auto stream = std::make_shared<testing::FakeSessionStream>();
    v1::WorkerSessionRequest open;
    open.mutable_open()->set_worker_id(resp.worker_id());
    open.mutable_open()->set_session_token(resp.session_token());
    service_->HandleWorkerSessionRequest(stream, open);
    EXPECT_FALSE(stream->finished().has_value());
    return stream;
  }

  std::string Submit(int r, int s, int c, int t) {
    v1::SubmitJobResponse resp;
    auto req = testing::SubmitRequest(r, s, c, t);
    EXPECT_TRUE(
        testing::Call([&](ReplyCallback d) { service_->HandleSubmitJob(req, &resp, d); }).ok());
    return resp.job_id();
  }

  v1::Job GetJob(const std::string& id) {
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::GetJobResponse resp;
    EXPECT_TRUE(
        testing::Call([&](ReplyCallback d) { service_->HandleGetJob(req, &resp, d); }).ok());
    return resp.job();
  }

  std::vector<v1::WorkerInfo> ListWorkers() {
    v1::ListWorkersResponse resp;
    EXPECT_TRUE(testing::Call([&](ReplyCallback d) {
                  service_->HandleListWorkers(v1::ListWorkersRequest(), &resp, d);
                }).ok());
    return {resp.workers().begin(), resp.workers().end()};
  }

  testing::FakeClock clock_;
  StoreManager store_{clock_, StoreLimits{}};
  std::unique_ptr<WorkerManager> workers_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<CoordinatorServiceImpl> service_;
};

}  // namespace meshrun::coordinator
