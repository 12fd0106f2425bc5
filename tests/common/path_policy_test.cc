// PathPolicy over a real temporary tree with symlinks: `..` that escapes, absolute paths
// elsewhere, symlinks out and within, relative paths, leaves that do not exist yet, trailing
// slashes, a root itself, and the shape of the messages.
#include "common/path_policy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using Access = PathPolicy::Access;

class PathPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() /
            ("meshrun-path-policy-" + std::to_string(getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(base_);
    // base/data/{train.txt, corpus/a.txt}, base/ckpt, base/secret/key, symlinks in data.
    fs::create_directories(base_ / "data" / "corpus");
    fs::create_directories(base_ / "ckpt");
    fs::create_directories(base_ / "secret");
    fs::create_directories(base_ / "data2");
    Touch(base_ / "data" / "train.txt");
    Touch(base_ / "data" / "corpus" / "a.txt");
    Touch(base_ / "secret" / "key");
    fs::create_symlink(base_ / "secret", base_ / "data" / "out");          // points out
    fs::create_symlink(base_ / "data" / "corpus", base_ / "data" / "in");  // points within
    fs::create_symlink("../secret/key", base_ / "data" / "relative-out");  // relative link out
    fs::create_symlink(base_ / "data", base_ / "data-link");               // a root via a link
    auto policy = PathPolicy::Create({Dir("data")}, {Dir("ckpt")});
    ASSERT_TRUE(policy.ok()) << policy.status().ToString();
    policy_ = *policy;
  }
  void TearDown() override { fs::remove_all(base_); }

  static void Touch(const fs::path& p) { std::ofstream(p) << "x"; }
  std::string Dir(const std::string& name) const { return (base_ / name).string(); }

  StatusOr<PathPolicy::Resolved> Read(const std::string& path) const {
    return policy_.Resolve("data.train", path, Access::kRead);
  }
  StatusOr<PathPolicy::Resolved> Write(const std::string& path) const {
    return policy_.Resolve("checkpoint.dir", path, Access::kWrite);
  }

  fs::path base_;
  PathPolicy policy_;
};

TEST_F(PathPolicyTest, NoRootsIsUnconfinedAndLeavesPathsAlone) {
  PathPolicy open;
  EXPECT_FALSE(open.confined());
  EXPECT_EQ(open.ToString(), "unconfined");
  auto r = open.Resolve("data.train", "../../etc/passwd", Access::kRead);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->real, "../../etc/passwd");
  JobSpec spec;
  spec.data.train = "/etc/passwd";
  spec.checkpoint.dir = "rel/ckpt";
  const JobSpec before = spec;
  EXPECT_TRUE(open.ConfineJobSpec(&spec, PathPolicy::Rewrite::kReal).ok());
  EXPECT_EQ(spec, before);
}

TEST_F(PathPolicyTest, PathsInsideTheRootAreAllowed) {
  auto r = Read(Dir("data") + "/train.txt");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->real, Dir("data") + "/train.txt");
  EXPECT_EQ(r->absolute, Dir("data") + "/train.txt");
  EXPECT_TRUE(Read(Dir("data") + "/corpus").ok());
}

TEST_F(PathPolicyTest, TheRootItselfIsInside) {
  EXPECT_TRUE(Read(Dir("ckpt")).ok());
  EXPECT_TRUE(Write(Dir("ckpt")).ok());
  // The data root holds links that point out (data/out, data/relative-out): named as a text
  // folder, those would be read, so the root is refused as a folder of data.
  auto r = Read(Dir("data"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("is a symlink to "), std::string::npos)
      << r.status().message();
}

TEST_F(PathPolicyTest, TrailingSlashIsIgnored) {
  auto r = Read(Dir("data") + "/corpus/");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->real, Dir("data") + "/corpus");
  auto root = Write(Dir("ckpt") + "/");
  ASSERT_TRUE(root.ok()) << root.status().ToString();
  EXPECT_EQ(root->real, Dir("ckpt"));
  // A root given with a trailing slash works the same.
  auto policy = PathPolicy::Create({Dir("data") + "/"}, {});
  ASSERT_TRUE(policy.ok());
  EXPECT_EQ(policy->data_roots().front(), Dir("data"));
  EXPECT_TRUE(policy->Resolve("data.train", Dir("data") + "/train.txt", Access::kRead).ok());
}

TEST_F(PathPolicyTest, DotDotThatStaysInsideIsAllowed) {
  auto r = Read(Dir("data") + "/corpus/../train.txt");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->real, Dir("data") + "/train.txt");
}

TEST_F(PathPolicyTest, DotDotThatEscapesIsRefused) {
  auto r = Read(Dir("data") + "/../secret/key");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("is outside the allowed data roots (" + Dir("data") + ")"),
            std::string::npos)
      << r.status().message();
  // Through a folder that does not exist yet: still escapes.
  EXPECT_FALSE(Read(Dir("data") + "/new/../../secret/key").ok());
  EXPECT_FALSE(Read("../secret/key").ok());
  EXPECT_FALSE(Write(Dir("ckpt") + "/../data").ok());
}

TEST_F(PathPolicyTest, AbsolutePathElsewhereIsRefusedWithTheFieldAndTheRoots) {
  auto r = Read("/etc/passwd");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "data.train: /etc/passwd is outside the allowed data roots (" + Dir("data") +
                ") and checkpoint roots (" + Dir("ckpt") +
                ") (hint: use a path under one of them; the cluster's operator adds roots with "
                "--data-root)");
  // A sibling whose name starts like the root is not inside it.
  EXPECT_FALSE(Read(Dir("data2")).ok());
  EXPECT_FALSE(Read(Dir("data") + "2/x").ok());
}

TEST_F(PathPolicyTest, SymlinkPointingOutIsRefused) {
  auto r = Read(Dir("data") + "/out/key");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("resolves to " + Dir("secret") + "/key, which is outside"),
            std::string::npos)
      << r.status().message();
  EXPECT_FALSE(Read(Dir("data") + "/out").ok());
  EXPECT_FALSE(Read(Dir("data") + "/relative-out").ok());
  // A leaf that does not exist yet below a link that points out.
  EXPECT_FALSE(Write(Dir("data") + "/out/new").ok());
  // `..` after a link is applied to where the link points, as the kernel does.
  EXPECT_FALSE(Read(Dir("data") + "/in/../../secret/key").ok());
}

TEST_F(PathPolicyTest, SymlinkWithinIsAllowedAndResolved) {
  auto r = Read(Dir("data") + "/in/a.txt");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->real, Dir("data") + "/corpus/a.txt");
  EXPECT_EQ(r->absolute, Dir("data") + "/in/a.txt");
  // A root named through a symlink admits the paths named through the link and directly.
  auto policy = PathPolicy::Create({Dir("data-link")}, {});
  ASSERT_TRUE(policy.ok());
  EXPECT_TRUE(policy->Resolve("data.train", Dir("data-link") + "/train.txt", Access::kRead).ok());
  EXPECT_TRUE(policy->Resolve("data.train", Dir("data") + "/train.txt", Access::kRead).ok());
}

TEST_F(PathPolicyTest, RelativePathsAreRelativeToTheFirstRootOfTheirKind) {
  auto r = Read("corpus/a.txt");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->absolute, Dir("data") + "/corpus/a.txt");
  auto w = Write("run-1");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->absolute, Dir("ckpt") + "/run-1");
  EXPECT_EQ(w->real, Dir("ckpt") + "/run-1");
  EXPECT_TRUE(Read("./train.txt").ok());
}

TEST_F(PathPolicyTest, NonExistentLeafInsideIsAllowed) {
  auto w = Write(Dir("ckpt") + "/job-7/not/yet");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->real, Dir("ckpt") + "/job-7/not/yet");
}

TEST_F(PathPolicyTest, WritesOnlyGoToCheckpointRootsReadsComeFromBoth) {
  auto w = Write(Dir("data") + "/ckpt");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().message(),
            "checkpoint.dir: " + Dir("data") + "/ckpt is outside the allowed checkpoint roots (" +
                Dir("ckpt") +
                ") (hint: use a folder under one of them, or leave checkpoint.dir empty; the "
                "cluster's operator adds roots with --checkpoint-root)");
  // A checkpoint of an earlier job may be read (init_from, data).
  EXPECT_TRUE(Read(Dir("ckpt") + "/step-00000010").ok());
}

TEST_F(PathPolicyTest, AKindWithoutRootsAllowsNothing) {
  auto policy = PathPolicy::Create({Dir("data")}, {});
  ASSERT_TRUE(policy.ok());
  EXPECT_TRUE(policy->confined());
  auto w = policy->Resolve("checkpoint.dir", Dir("data"), Access::kWrite);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("checkpoint roots (none)"), std::string::npos)
      << w.status().message();
}

TEST_F(PathPolicyTest, NulBytesAndOverlongPathsAreRefused) {
  EXPECT_FALSE(Read(Dir("data") + std::string("/a\0b", 4)).ok());
  EXPECT_FALSE(Read(Dir("data") + "/" + std::string(5000, 'a')).ok());
}

TEST_F(PathPolicyTest, ConfineJobSpecChecksEveryPathAndRewritesThem) {
  JobSpec spec;
  spec.data.train = "in/a.txt";
  spec.data.val = Dir("data") + "/train.txt";
  spec.model.init_from = Dir("ckpt") + "/export";
  spec.checkpoint.dir = "run";
  JobSpec absolute = spec;
  ASSERT_TRUE(policy_.ConfineJobSpec(&absolute, PathPolicy::Rewrite::kAbsolute).ok());
  EXPECT_EQ(absolute.data.train, Dir("data") + "/in/a.txt");
  EXPECT_EQ(absolute.checkpoint.dir, Dir("ckpt") + "/run");
  JobSpec real = spec;
  ASSERT_TRUE(policy_.ConfineJobSpec(&real, PathPolicy::Rewrite::kReal).ok());
  EXPECT_EQ(real.data.train, Dir("data") + "/corpus/a.txt");
  EXPECT_EQ(real.data.val, Dir("data") + "/train.txt");
  EXPECT_EQ(real.model.init_from, Dir("ckpt") + "/export");

  // One escaping field refuses the spec, names that field, and leaves the spec untouched.
  JobSpec bad = spec;
  bad.model.init_from = Dir("data") + "/out";
  const JobSpec before = bad;
  Status s = policy_.ConfineJobSpec(&bad, PathPolicy::Rewrite::kReal);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind("model.init_from: ", 0), 0u) << s.message();
  EXPECT_EQ(bad, before);
  bad = spec;
  bad.data.val = "/etc/hosts";
  s = policy_.ConfineJobSpec(&bad, PathPolicy::Rewrite::kAbsolute);
  EXPECT_EQ(s.message().rfind("data.val: /etc/hosts is outside", 0), 0u) << s.message();
}

TEST_F(PathPolicyTest, BadRootFlagsAreNamed) {
  auto policy = PathPolicy::Create({""}, {});
  ASSERT_FALSE(policy.ok());
  EXPECT_EQ(policy.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(policy.status().message().rfind("--data-root: ", 0), 0u);
  policy = PathPolicy::Create({}, {""});
  ASSERT_FALSE(policy.ok());
  EXPECT_EQ(policy.status().message().rfind("--checkpoint-root: ", 0), 0u);
}

TEST(PathIsWithinTest, ComparesWholeComponents) {
  EXPECT_TRUE(PathIsWithin("/data", "/data"));
  EXPECT_TRUE(PathIsWithin("/data/x/y", "/data"));
  EXPECT_FALSE(PathIsWithin("/data2", "/data"));
  EXPECT_FALSE(PathIsWithin("/dat", "/data"));
  EXPECT_FALSE(PathIsWithin("/", "/data"));
  EXPECT_TRUE(PathIsWithin("/anything", "/"));
}

// A folder the spec names is read entry by entry: a symlink inside it that leaves the roots is
// refused, not only a symlink on the way to the folder.
TEST_F(PathPolicyTest, SymlinkInsideANamedFolderPointingOutIsRefused) {
  fs::create_directories(base_ / "data" / "texts");
  Touch(base_ / "data" / "texts" / "a.txt");
  EXPECT_TRUE(Read(Dir("data") + "/texts").ok());
  fs::create_symlink(base_ / "secret" / "key", base_ / "data" / "texts" / "b.txt");
  auto r = Read(Dir("data") + "/texts");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(
      r.status().message().rfind("data.train: " + Dir("data") + "/texts/b.txt is a symlink to " +
                                     Dir("secret") + "/key, which is outside",
                                 0),
      0u)
      << r.status().message();
  // One level further down (a checkpoint.dir's step-* folders) too.
  fs::create_directories(base_ / "ckpt" / "run" / "step-00000001");
  EXPECT_TRUE(Write(Dir("ckpt") + "/run").ok());
  fs::create_symlink(base_ / "secret", base_ / "ckpt" / "run" / "step-00000001" / "shard");
  auto w = Write(Dir("ckpt") + "/run");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("is a symlink to " + Dir("secret")), std::string::npos)
      << w.status().message();
  // A link within the roots is fine.
  fs::remove(base_ / "data" / "texts" / "b.txt");
  fs::create_symlink(base_ / "data" / "train.txt", base_ / "data" / "texts" / "c.txt");
  EXPECT_TRUE(Read(Dir("data") + "/texts").ok());
}

}  // namespace
}  // namespace meshrun
