// The OpenMP wait policy of rank processes (see openmp_environment.h).
#include "supervisor/openmp_environment.h"

#include <cstdlib>

namespace meshrun {

std::vector<std::pair<std::string, std::string>> RankOpenMpEnvironment() {
  std::vector<std::pair<std::string, std::string>> env;
  for (const char* name : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"}) {
    if (const char* value = std::getenv(name); value != nullptr) env.emplace_back(name, value);
  }
  if (env.empty()) env.emplace_back("OMP_WAIT_POLICY", "passive");
  return env;
}

bool OpenMpWaitUnset() {
  return std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr;
}

bool CommandWaitsAsRanks(std::string_view command) {
  return command == "train" || command == "eval" || command == "generate" || command == "plan";
}

}  // namespace meshrun
