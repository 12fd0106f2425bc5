// common/tls: the loopback rule, token files, bearer headers, constant-time comparison and the
// errors of LoadTls for files that cannot be used (certificates themselves are exercised by
// tests/integration/security_test.cc).
#include "common/tls.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace meshrun {
namespace {

namespace fs = std::filesystem;

fs::path TempFile(const std::string& name, const std::string& text) {
  const fs::path path =
      fs::temp_directory_path() / ("meshrun-tls-test-" + std::to_string(getpid()) + "-" + name);
  std::ofstream(path) << text;
  return path;
}

TEST(TlsTest, LoopbackAddresses) {
  for (const char* a :
       {"127.0.0.1:7070", "127.1.2.3:1", "localhost:50051", "LOCALHOST:1", "[::1]:7070",
        "unix:/tmp/meshrun.sock", "dns:///localhost:1", "ipv4:127.0.0.1:9"}) {
    EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  }
  for (const char* a :
       {"0.0.0.0:7070", "[::]:7070", "10.0.0.1:7070", "127.0.0.1.evil.com:1", "127.0.0:1",
        "127.0.0.256:1", "localhost.example.com:1", "host:1", "127.0.0.1", ""}) {
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
  }
  EXPECT_EQ(HostOfAddress("[::1]:80"), "::1");
  EXPECT_EQ(HostOfAddress("node-1:80"), "node-1");
}

TEST(TlsTest, PlaintextRuleNamesTheFlag) {
  EXPECT_TRUE(CheckPlaintextTarget("--coordinator", "127.0.0.1:1", false, false, "X").ok());
  EXPECT_TRUE(CheckPlaintextTarget("--coordinator", "10.0.0.1:1", true, false, "X").ok());
  EXPECT_TRUE(CheckPlaintextTarget("--coordinator", "10.0.0.1:1", false, true, "X").ok());
  Status s = CheckPlaintextTarget("--listen", "0.0.0.0:7070", false, false,
                                  "--tls-cert, --tls-key and --tls-ca");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "--listen: 0.0.0.0:7070 is not loopback and no TLS is configured (hint: pass "
            "--tls-cert, --tls-key and --tls-ca, or --insecure on a trusted network)");
}

TEST(TlsTest, TokenFileSkipsCommentsAndBlankLines) {
  const fs::path path =
      TempFile("tokens", "# admins\n\n  alpha  \r\nbeta\n   # indented comment\n");
  StatusOr<std::vector<std::string>> tokens = ReadTokenFile("--token-file", path.string());
  ASSERT_TRUE(tokens.ok()) << tokens.status().ToString();
  EXPECT_EQ(*tokens, (std::vector<std::string>{"alpha", "beta"}));

  const fs::path empty = TempFile("empty", "# nothing here\n\n");
  Status none = ReadTokenFile("--token-file", empty.string()).status();
  EXPECT_EQ(none.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(none.message().rfind("--token-file: ", 0), 0u) << none.message();
  Status missing = ReadTokenFile("--token-file", "/nonexistent/tokens").status();
  EXPECT_EQ(missing.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.message().find("cannot read '/nonexistent/tokens'"), std::string::npos);
  fs::remove(path);
  fs::remove(empty);
}

TEST(TlsTest, ConstantTimeEqualsIsEquality) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("secret", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secreT"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secret2"));
  EXPECT_FALSE(ConstantTimeEquals("secret", ""));
  EXPECT_FALSE(ConstantTimeEquals("", "secret"));
  // A repeated prefix is not the same token.
  EXPECT_FALSE(ConstantTimeEquals("abab", "ab"));
}

TEST(TlsTest, BearerHeader) {
  EXPECT_EQ(BearerToken("Bearer abc"), "abc");
  EXPECT_EQ(BearerToken("bearer  abc "), "abc");
  EXPECT_EQ(BearerToken("Basic abc"), "");
  EXPECT_EQ(BearerToken("Bearer"), "");
  EXPECT_EQ(BearerToken("abc"), "");
}

TEST(TlsTest, LoadTlsNamesTheFlagOfAnUnusableFile) {
  TlsFiles files;
  files.cert = "/nonexistent/server.crt";
  Status s = LoadTls(files, true, true).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("--tls-key: is required", 0), 0u) << s.message();

  files.key = "/nonexistent/server.key";
  files.ca = "/nonexistent/ca.crt";
  s = LoadTls(files, true, true).status();
  EXPECT_EQ(s.message().rfind("--tls-cert: cannot read '/nonexistent/server.crt'", 0), 0u)
      << s.message();

  const fs::path junk = TempFile("junk.pem", "not a certificate\n");
  files.cert = junk.string();
  s = LoadTls(files, true, true).status();
  EXPECT_EQ(s.message().rfind("--tls-cert: '" + junk.string() + "' holds no PEM certificate", 0),
            0u)
      << s.message();

  TlsFiles ca_only;
  ca_only.ca = junk.string();
  TlsFlagNames names;
  names.ca = "MESHRUN_TLS_CA";
  s = LoadTls(ca_only, false, true, names).status();
  EXPECT_EQ(s.message().rfind("MESHRUN_TLS_CA: ", 0), 0u) << s.message();
  fs::remove(junk);
}

}  // namespace
}  // namespace meshrun
