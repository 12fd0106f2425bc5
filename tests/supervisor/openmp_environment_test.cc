// Which `meshrun` commands wait as ranks do (decision 0025): every command that runs the model
// in its own process, or measures for the ranks, re-executes itself with OMP_WAIT_POLICY=passive
// (client/main.cc).
#include "supervisor/openmp_environment.h"

#include <gtest/gtest.h>

namespace meshrun {
namespace {

TEST(OpenMpEnvironment, CommandsThatRunTheModelWaitPassively) {
  EXPECT_TRUE(CommandWaitsAsRanks("train"));
  // eval spun 37x slower than train on a busy host before it waited as ranks do.
  EXPECT_TRUE(CommandWaitsAsRanks("eval"));
  EXPECT_TRUE(CommandWaitsAsRanks("generate"));
  // plan measures the GEMM rate (and --calibrate the loopback) the ranks will get.
  EXPECT_TRUE(CommandWaitsAsRanks("plan"));
  // Commands that do not run the model keep libgomp's default (no re-execution).
  for (const char* other : {"validate", "submit", "jobs", "__rank", "", "trainx"}) {
    EXPECT_FALSE(CommandWaitsAsRanks(other)) << other;
  }
}

}  // namespace
}  // namespace meshrun
