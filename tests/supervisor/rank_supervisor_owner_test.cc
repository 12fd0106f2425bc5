// How the supervisor's own lines about a killed rank read: a rank that outlives its stop's
// grace is called hung, under the owner's name (meshrun-worker, or `meshrun train` standalone);
// a rank killed by a stop of no grace (a second Ctrl-C) was killed as asked, not found hung.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "supervisor/rank_supervisor.h"

namespace meshrun {
namespace {

using namespace std::chrono_literals;

struct Seen {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> err;
  std::map<int, RankExit> exits;
  bool ready = false;

  RankSupervisor::Callbacks Callbacks(const std::string& owner) {
    RankSupervisor::Callbacks c;
    c.owner = owner;
    c.on_line = [this](const RankKey&, bool is_stderr, std::string line) {
      std::lock_guard<std::mutex> lock(mu);
      if (is_stderr) err.push_back(line);
      if (line == "ready") ready = true;
      cv.notify_all();
    };
    c.on_exited = [this](const RankKey& k, const RankExit& e) {
      std::lock_guard<std::mutex> lock(mu);
      exits[k.rank] = e;
      cv.notify_all();
    };
    return c;
  }
  bool Wait(const std::function<bool()>& what) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, 15s, what);
  }
};

RankSpawn Stubborn() {
  RankSpawn s;
  s.key = RankKey{"standalone", 0, 0};
  s.argv = {"/bin/sh", "-c", "trap '' TERM; echo ready; while true; do sleep 0.05; done"};
  s.env = {"PATH=/usr/bin:/bin"};
  return s;
}

TEST(RankSupervisorOwner, RankPastItsGraceIsHungUnderTheOwnersName) {
  Seen seen;
  RankSupervisor sup(seen.Callbacks("meshrun train"));
  ASSERT_TRUE(sup.Start(Stubborn()).ok());
  ASSERT_TRUE(seen.Wait([&] { return seen.ready; }));
  sup.Stop("standalone", 0, 200ms);
  ASSERT_TRUE(seen.Wait([&] { return seen.exits.count(0) > 0; }));
  std::lock_guard<std::mutex> lock(seen.mu);
  ASSERT_FALSE(seen.err.empty());
  EXPECT_EQ(seen.err.back().rfind("meshrun train: rank 0 did not exit within its stop's grace "
                                  "period and was killed",
                                  0),
            0u)
      << seen.err.back();
  EXPECT_EQ(seen.exits[0].signal, SIGKILL);
  EXPECT_NE(seen.exits[0].error.find("a hung rank"), std::string::npos) << seen.exits[0].error;
}

TEST(RankSupervisorOwner, SecondInterruptKillsAsAskedNotHung) {
  Seen seen;
  RankSupervisor sup(seen.Callbacks("meshrun train"));
  ASSERT_TRUE(sup.Start(Stubborn()).ok());
  ASSERT_TRUE(seen.Wait([&] { return seen.ready; }));
  sup.Stop("standalone", 0, 30s);  // the first Ctrl-C: stop at the step's end
  sup.Stop("standalone", 0, 0ms);  // the second: at once
  ASSERT_TRUE(seen.Wait([&] { return seen.exits.count(0) > 0; }));
  std::lock_guard<std::mutex> lock(seen.mu);
  EXPECT_EQ(seen.exits[0].signal, SIGKILL);
  EXPECT_NE(seen.exits[0].error.find("was killed at once, as its stop asked"), std::string::npos)
      << seen.exits[0].error;
  for (const std::string& line : seen.err) {
    EXPECT_EQ(line.find("hung"), std::string::npos) << line;
    EXPECT_EQ(line.find("meshrun-worker"), std::string::npos) << line;
    EXPECT_EQ(line.find("stop order"), std::string::npos) << line;
  }
  EXPECT_EQ(seen.exits[0].error.find("hung"), std::string::npos) << seen.exits[0].error;
}

}  // namespace
}  // namespace meshrun
