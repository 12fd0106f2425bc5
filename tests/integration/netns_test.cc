// A cluster across hosts, made of network namespaces (issue #16): a bridge and three namespaces
// joined to it by veth pairs, each with its own address; the coordinator in one (TLS, client
// certificates, a token file), a 1-slot worker in each of the others with its own certificate.
// A 2-rank job spans both workers, so Gloo runs between namespaces, and must end SUCCEEDED with
// the losses of the same job trained on one host. Plaintext off loopback is refused. Needs root
// and `ip` (iproute2); skipped otherwise (reported as skipped, exit 77). Every wait is bounded.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/client/cli_runner.h"
#include "tests/integration/daemons.h"
#include "tests/integration/test_certs.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

using testing::kCorpus;

std::string FindIp() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (fs::exists(p)) return p;
  }
  return "";
}

std::string Spec() {
  return "name: netns\n"
         "model: {arch: gpt2, n_layer: 2, n_head: 2, d_model: 64, seq_len: 64, vocab_size: 256}\n"
         "parallelism: {dp_replicate_size: 1, dp_shard_size: 2, cp_size: 1, tp_size: 1}\n"
         "train: {steps: 12, global_batch_size: 8, micro_batch_size: 2, lr: 1.0e-3, min_lr: "
         "1.0e-4, warmup_steps: 2, seed: 1337}\n"
         "data: {train: " +
         std::string(kCorpus) + ", format: text}\n";
}

class NetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces)";
    ip_ = FindIp();
    if (ip_.empty()) GTEST_SKIP() << "no `ip` command (apt-get install iproute2)";
    for (const char* bin : {"meshrun", "meshrun-worker", "meshrun-coordinator"}) {
      if (!fs::exists(testing::BinDir() / bin)) GTEST_SKIP() << bin << " is not built";
    }
    if (!fs::exists(kCorpus)) GTEST_SKIP() << kCorpus << " is missing";
    char pattern[] = "/tmp/meshrun_netns_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    // Names and a /24 of our own, so parallel runs do not collide.
    const int id = static_cast<int>(getpid() % 10000);
    tag_ = std::to_string(id);
    subnet_ = "10.213." + std::to_string(id % 250) + ".";
    bridge_ = "mrbr" + tag_;
    if (!Sh(ip_ + " link add " + bridge_ + " type bridge") ||
        !Sh(ip_ + " link set " + bridge_ + " up")) {
      GTEST_SKIP() << "cannot create a bridge here (no CAP_NET_ADMIN?)";
    }
    for (int i = 0; i < 3; ++i) {
      const std::string ns = Ns(i), host = "mv" + tag_ + "h" + std::to_string(i),
                        peer = "mv" + tag_ + "n" + std::to_string(i);
      if (!Sh(ip_ + " netns add " + ns)) GTEST_SKIP() << "cannot create network namespaces";
      namespaces_.push_back(ns);
      // `ip netns exec` mounts a /sys of its own, which a chroot or a container may refuse
      // (seen in scripts/fresh-check's root): nothing can run inside the namespaces then.
      if (!Sh(ip_ + " netns exec " + ns + " true")) {
        GTEST_SKIP() << "cannot run commands in a network namespace here (`ip netns exec " << ns
                     << " true` failed: a chroot or container without mount privileges?)";
      }
      ASSERT_TRUE(Sh(ip_ + " link add " + host + " type veth peer name " + peer));
      ASSERT_TRUE(Sh(ip_ + " link set " + peer + " netns " + ns));
      ASSERT_TRUE(Sh(ip_ + " link set " + host + " master " + bridge_ + " up"));
      ASSERT_TRUE(Sh(ip_ + " netns exec " + ns + " ip addr add " + Addr(i) + "/24 dev " + peer));
      ASSERT_TRUE(Sh(ip_ + " netns exec " + ns + " ip link set " + peer + " up"));
      ASSERT_TRUE(Sh(ip_ + " netns exec " + ns + " ip link set lo up"));
    }
    certs_.Generate(dir_ / "certs", {"wa", "wb"}, {"IP:" + Addr(0)});
    if (!certs_.error.empty()) GTEST_SKIP() << certs_.error;
    std::ofstream(dir_ / "tokens") << "# test tokens\n"
                                   << "netns-test-token-0123456789abcdef\n";
  }

  void TearDown() override {
    for (testing::Daemon& d : daemons_) testing::Stop(d, 5s);
    for (const std::string& ns : namespaces_) Sh(ip_ + " netns del " + ns);
    if (!bridge_.empty()) Sh(ip_ + " link del " + bridge_);
    if (HasFailure()) {
      std::cerr << "logs kept in " << dir_ << std::endl;
    } else if (!dir_.empty()) {
      fs::remove_all(dir_);
    }
  }

  static bool Sh(const std::string& command) {
    return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
  }
  std::string Ns(int i) const { return "mr" + tag_ + "-" + std::to_string(i); }
  std::string Addr(int i) const { return subnet_ + std::to_string(i + 1); }
  std::string Coordinator() const { return Addr(0) + ":7070"; }

  // `binary args…` inside namespace `ns`, bounded.
  testing::CliResult In(int ns, const std::string& binary, const std::vector<std::string>& args,
                        int timeout_s = 20) {
    std::vector<std::string> full = {"netns", "exec", Ns(ns),
                                     (testing::BinDir() / binary).string()};
    full.insert(full.end(), args.begin(), args.end());
    return testing::RunCli(ip_, full, dir_ / "cli.err", timeout_s);
  }
  void Start(int ns, const std::string& name, const std::string& binary,
             const std::vector<std::string>& args) {
    std::vector<std::string> argv = {ip_, "netns", "exec", Ns(ns),
                                     (testing::BinDir() / binary).string()};
    argv.insert(argv.end(), args.begin(), args.end());
    daemons_.push_back(testing::Spawn(name, argv, dir_ / (name + ".log")));
  }
  std::vector<std::string> Client(std::vector<std::string> args) const {
    for (const std::string& a :
         {std::string("--coordinator"), Coordinator(), std::string("--tls-ca"), certs_.ca(),
          std::string("--token-file"), (dir_ / "tokens").string()}) {
      args.push_back(a);
    }
    return args;
  }
  json Status(const std::string& job) {
    testing::CliResult r = In(0, "meshrun", Client({"status", job, "-o", "json"}), 10);
    return r.exit_code == 0 ? json::parse(r.out, nullptr, false) : json();
  }

  std::string ip_, tag_, subnet_, bridge_;
  std::vector<std::string> namespaces_;
  std::vector<testing::Daemon> daemons_;
  testing::TestCerts certs_;
  fs::path dir_;
};

TEST_F(NetnsTest, JobAcrossNamespacesWithTlsHasTheSingleHostLosses) {
  // The single-host run first.
  std::ofstream(dir_ / "job.yaml") << Spec();
  testing::CliResult local =
      testing::RunCli(testing::BinDir() / "meshrun",
                      {"train", "-f", (dir_ / "job.yaml").string(), "--nproc", "2", "-o", "json"},
                      dir_ / "local.err", 300);
  ASSERT_EQ(local.exit_code, 0) << testing::ReadFile(dir_ / "local.err");
  std::vector<double> local_losses;
  for (const std::string& line : testing::Lines(local.out)) {
    json j = json::parse(line, nullptr, false);
    if (j.is_object() && j["event"] == "summary") {
      local_losses = j["losses"].get<std::vector<double>>();
    }
  }
  ASSERT_EQ(local_losses.size(), 12u) << local.out;

  // Plaintext off loopback is refused, by the coordinator and by the client.
  testing::CliResult plain =
      In(0, "meshrun-coordinator",
         {"--listen", Addr(0) + ":7071", "--state-dir", (dir_ / "plain-state").string()});
  EXPECT_EQ(plain.exit_code, 2);
  EXPECT_NE(testing::ReadFile(dir_ / "cli.err").find("is not loopback and no TLS"),
            std::string::npos)
      << testing::ReadFile(dir_ / "cli.err");

  Start(0, "coordinator", "meshrun-coordinator",
        {"--listen", Coordinator(), "--advertise-address", Addr(0), "--state-dir",
         (dir_ / "state").string(), "--heartbeat-timeout", "5", "--tls-cert",
         certs_.cert("coordinator"), "--tls-key", certs_.key("coordinator"), "--tls-ca",
         certs_.ca(), "--token-file", (dir_ / "tokens").string()});
  for (int i : {1, 2}) {
    const std::string name = i == 1 ? "wa" : "wb";
    Start(i, name, "meshrun-worker", {"--coordinator", Coordinator(),
                                      "--name",        name,
                                      "--slots",       "1",
                                      "--address",     Addr(i),
                                      "--work-dir",    (dir_ / "work" / name).string(),
                                      "--cores",       "1",
                                      "--grace",       "2",
                                      "--tls-cert",    certs_.cert(name),
                                      "--tls-key",     certs_.key(name),
                                      "--tls-ca",      certs_.ca()});
  }
  std::set<std::string> ready;
  for (const Clock::time_point until = Clock::now() + 40s; Clock::now() < until;) {
    testing::CliResult r = In(0, "meshrun", Client({"workers", "-o", "json"}), 10);
    ready.clear();
    if (r.exit_code == 0) {
      for (const json& w : json::parse(r.out, nullptr, false)) {
        if (w["state"] == "READY") ready.insert(w["name"].get<std::string>());
      }
    }
    if (ready.size() == 2) break;
    std::this_thread::sleep_for(200ms);
  }
  ASSERT_EQ(ready, (std::set<std::string>{"wa", "wb"})) << testing::ReadFile(dir_ / "wa.log");
  // Without the CA the client does not talk plaintext to it.
  testing::CliResult no_tls =
      In(0, "meshrun",
         {"workers", "--coordinator", Coordinator(), "--token-file", (dir_ / "tokens").string()});
  EXPECT_NE(no_tls.exit_code, 0);

  testing::CliResult submitted =
      In(0, "meshrun", Client({"submit", "-f", (dir_ / "job.yaml").string(), "-o", "json"}));
  ASSERT_EQ(submitted.exit_code, 0) << testing::ReadFile(dir_ / "cli.err");
  const std::string job = json::parse(submitted.out)["job_id"].get<std::string>();
  json s;
  for (const Clock::time_point until = Clock::now() + 240s; Clock::now() < until;) {
    s = Status(job);
    if (s.is_object() && (s["state"] == "SUCCEEDED" || s["state"] == "FAILED")) break;
    std::this_thread::sleep_for(200ms);
  }
  ASSERT_EQ(s["state"], "SUCCEEDED") << s.dump();
  EXPECT_EQ(s["restarts"], 0);
  std::set<std::string> workers;
  for (const json& r : s["ranks"]) workers.insert(r["worker"].get<std::string>());
  EXPECT_EQ(workers, (std::set<std::string>{"wa", "wb"})) << "the job did not span both hosts";
  // The losses, step by step, from rank 0's step lines.
  testing::CliResult logs = In(0, "meshrun", Client({"logs", job, "--rank", "0"}));
  std::vector<double> losses;
  for (const std::string& line : testing::Lines(logs.out)) {
    const size_t brace = line.find('{');
    if (brace == std::string::npos) continue;
    json j = json::parse(line.substr(brace), nullptr, false);
    if (j.is_object() && j["event"] == "summary") losses = j["losses"].get<std::vector<double>>();
  }
  ASSERT_EQ(losses.size(), local_losses.size()) << logs.out;
  for (size_t k = 0; k < losses.size(); ++k) {
    EXPECT_NEAR(losses[k], local_losses[k], 1e-6 * std::abs(local_losses[k])) << "step " << k + 1;
  }
}

}  // namespace
}  // namespace meshrun
