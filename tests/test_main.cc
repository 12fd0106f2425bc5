// The main() of every GoogleTest executable (instead of gtest_main): runs the tests and exits
// with MESHRUN_TEST_SKIP_CODE when none failed but at least one was skipped (GTEST_SKIP), so
// that ctest, told by the SKIP_RETURN_CODE property, reports the test as skipped, not passed.
// A failure still exits 1: a skip never hides one, and neither does running no test at all.
#include <gtest/gtest.h>

#include <cstdio>

#ifndef MESHRUN_TEST_SKIP_CODE
#error "MESHRUN_TEST_SKIP_CODE must be defined (tests/CMakeLists.txt)"
#endif

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  // A ctest entry of a test group selects its file's suites by --gtest_filter
  // (meshrun_add_test): a filter that matches nothing would otherwise pass without testing.
  if (unit.test_to_run_count() == 0) {
    std::printf("no test matched the filter \"%s\": exit 1\n",
                ::testing::GTEST_FLAG(filter).c_str());
    return 1;
  }
  if (failed != 0) return failed;
  if (unit.skipped_test_count() > 0) {
    std::printf("%d of %d tests skipped (see the [  SKIPPED ] lines above for why): exit %d\n",
                unit.skipped_test_count(), unit.test_to_run_count(), MESHRUN_TEST_SKIP_CODE);
    return MESHRUN_TEST_SKIP_CODE;
  }
  return 0;
}
