// Authorizer: bearer tokens for the client API, the certificate's worker for worker RPCs, and
// the placement rule for store calls and session reports. No sockets: the placement and the
// worker names are plain functions.
#include "coordinator/auth.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "coordinator/rate_limiter.h"
#include "tests/coordinator/test_util.h"

namespace meshrun::coordinator {
namespace {

class AuthTest : public ::testing::Test {
 protected:
  std::unique_ptr<Authorizer> Make(bool tls, const std::string& tokens) {
    AuthConfig config;
    config.tls = tls;
    if (!tokens.empty()) {
      config.token_file = dir_.path() + "/tokens";
      std::ofstream(config.token_file) << tokens;
    }
    auto auth = Authorizer::Create(
        config,
        [this](const std::string& worker, const std::string& job,
               int attempt) -> std::optional<bool> {
          auto it = placed_.find({job, attempt});
          if (it == placed_.end()) return std::nullopt;
          return it->second == worker;
        },
        [](const std::string& id) -> std::optional<std::string> {
          if (id == "wkr-1") return "worker-a";
          if (id == "wkr-2") return "worker-b";
          return std::nullopt;
        });
    EXPECT_TRUE(auth.ok()) << auth.status().ToString();
    return std::move(auth).value();
  }

  testing::TempDir dir_;
  std::map<std::pair<std::string, int>, std::string> placed_ = {{{"job-1", 1}, "worker-a"}};
};

TEST_F(AuthTest, WithoutTokenFileTheClientApiIsOpen) {
  auto auth = Make(false, "");
  EXPECT_FALSE(auth->tokens_required());
  EXPECT_TRUE(auth->CheckClient(std::nullopt).ok());
  EXPECT_TRUE(auth->CheckClient("Bearer anything").ok());
}

TEST_F(AuthTest, TokensAreCheckedAgainstEveryLine) {
  auto auth = Make(false, "# comment\nfirst\nsecond\n");
  EXPECT_EQ(auth->token_count(), 2u);
  EXPECT_TRUE(auth->CheckClient("Bearer first").ok());
  EXPECT_TRUE(auth->CheckClient("Bearer second").ok());
  for (const char* bad : {"Bearer firs", "Bearer first2", "Bearer # comment", "first", ""}) {
    Status s = auth->CheckClient(std::string_view(bad));
    EXPECT_EQ(s.code(), StatusCode::kUnauthenticated) << bad;
    EXPECT_NE(s.message().find("hint:"), std::string::npos);
  }
  EXPECT_EQ(auth->CheckClient(std::nullopt).code(), StatusCode::kUnauthenticated);
}

TEST_F(AuthTest, MissingTokenFileIsAnErrorNamingTheFlag) {
  AuthConfig config;
  config.token_file = dir_.path() + "/absent";
  auto auth = Authorizer::Create(config, nullptr, nullptr);
  ASSERT_FALSE(auth.ok());
  EXPECT_EQ(auth.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(auth.status().message().rfind("--token-file: ", 0), 0u);
}

TEST_F(AuthTest, ReloadKeepsTheOldTokensOnError) {
  auto auth = Make(false, "old\n");
  std::ofstream(dir_.path() + "/tokens") << "new\n";
  ASSERT_TRUE(auth->ReloadTokens().ok());
  EXPECT_FALSE(auth->CheckClient("Bearer old").ok());
  EXPECT_TRUE(auth->CheckClient("Bearer new").ok());
  std::ofstream(dir_.path() + "/tokens") << "\n";
  EXPECT_FALSE(auth->ReloadTokens().ok());
  EXPECT_TRUE(auth->CheckClient("Bearer new").ok());
}

TEST_F(AuthTest, WithoutTlsWorkersHaveNoIdentityAndNoChecks) {
  auto auth = Make(false, "");
  StatusOr<std::string> id = auth->WorkerIdentity(std::nullopt);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(*id, "");
  EXPECT_TRUE(auth->CheckRegister("", "worker-b").ok());
  EXPECT_TRUE(auth->CheckOpen("", "wkr-1").ok());
  EXPECT_TRUE(auth->CheckAttempt("", "job-1", 1, "StoreGet").ok());
}

TEST_F(AuthTest, WithTlsTheCertificateNamesTheWorker) {
  auto auth = Make(true, "");
  EXPECT_EQ(auth->WorkerIdentity(std::nullopt).status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(auth->WorkerIdentity(std::string()).status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(*auth->WorkerIdentity(std::string("worker-a")), "worker-a");

  EXPECT_TRUE(auth->CheckRegister("worker-a", "worker-a").ok());
  EXPECT_EQ(auth->CheckRegister("worker-a", "worker-b").code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(auth->CheckOpen("worker-a", "wkr-1").ok());
  EXPECT_EQ(auth->CheckOpen("worker-b", "wkr-1").code(), StatusCode::kPermissionDenied);
  // Unknown ids are the handler's NOT_FOUND.
  EXPECT_TRUE(auth->CheckOpen("worker-b", "wkr-9").ok());
}

TEST_F(AuthTest, AttemptsAreReachableOnlyByTheirWorkers) {
  auto auth = Make(true, "");
  EXPECT_TRUE(auth->CheckAttempt("worker-a", "job-1", 1, "StoreSet").ok());
  Status denied = auth->CheckAttempt("worker-b", "job-1", 1, "StoreSet");
  EXPECT_EQ(denied.code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(denied.message().rfind("StoreSet: worker 'worker-b' has no rank of job job-1", 0), 0u)
      << denied.message();
  // Attempts the coordinator does not know are left to the handler (NOT_FOUND / ABORTED).
  EXPECT_TRUE(auth->CheckAttempt("worker-b", "job-1", 2, "StoreGet").ok());
  EXPECT_TRUE(auth->CheckAttempt("worker-b", "job-9", 1, "StoreGet").ok());
}

TEST_F(AuthTest, SubmitCallerIsTheParsedTokenOrThePeerHost) {
  // With tokens: one token however it is spelt is one caller, and it is not the peer.
  auto auth = Make(false, "tok-1\ntok-2\n");
  const std::string one = auth->ClientCaller(std::string_view("Bearer tok-1"), "ipv4:10.0.0.1:5");
  EXPECT_EQ(one.rfind(kTokenCallerPrefix, 0), 0u);
  EXPECT_EQ(auth->ClientCaller(std::string_view("bearer    tok-1  "), "ipv4:10.0.0.2:6"), one);
  EXPECT_NE(auth->ClientCaller(std::string_view("Bearer tok-2"), "ipv4:10.0.0.1:5"), one);
  // Without tokens a header proves nothing: every spelling, every made-up token, is the host.
  auto open = Make(false, "");
  for (const char* header : {"Bearer a", "Bearer b", "Basic x", "anything"}) {
    EXPECT_EQ(open->ClientCaller(std::string_view(header), "ipv4:10.0.0.7:41234"), "ipv4:10.0.0.7")
        << header;
  }
  EXPECT_EQ(open->ClientCaller(std::nullopt, "ipv4:10.0.0.7:1"), "ipv4:10.0.0.7");
}

}  // namespace
}  // namespace meshrun::coordinator
