# Writes the header behind `meshrun --version` (run by the meshrun_version target on every build):
# the version, the commit the binary was built from (git describe, when the tree is a clone and git
# is installed; "unknown" otherwise) and the build options. The file is rewritten only when its
# text changes, so an unchanged tree recompiles nothing.
#   cmake -DSOURCE_DIR=… -DOUTPUT=… -DGIT=… -DOPTIONS="Release|cuda=ON|…" -DVERSION=… -P MeshrunVersion.cmake
set(commit "unknown")
if(GIT)
  execute_process(COMMAND ${GIT} -C ${SOURCE_DIR} describe --always --dirty
                  OUTPUT_VARIABLE describe OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE describe_rc ERROR_QUIET)
  if(describe_rc EQUAL 0 AND describe)
    set(commit "${describe}")
  endif()
endif()
string(REPLACE "|" "; " options "${OPTIONS}")  # "|" separates them on the command line
set(text "#pragma once\n#define MESHRUN_VERSION \"${VERSION} (commit ${commit}; ${options})\"\n")
if(EXISTS ${OUTPUT})
  file(READ ${OUTPUT} old)
else()
  set(old "")
endif()
if(NOT old STREQUAL text)
  file(WRITE ${OUTPUT} "${text}")
endif()
