# Small helpers so every CMakeLists.txt in the tree reads the same way.
#
#   meshrun_add_library(NAME SOURCES a.cc b.cc DEPS lib1 lib2)
#   meshrun_add_test(NAME SOURCES t.cc DEPS lib LABELS unit [TIMEOUT s] [GROUP g])
#   meshrun_add_test_group(g)
#   meshrun_add_executable(NAME SOURCES main.cc DEPS lib [OUTPUT_NAME name])

function(meshrun_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PUBLIC_DEFS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  if(ARG_PUBLIC_DEFS)
    target_compile_definitions(${name} PUBLIC ${ARG_PUBLIC_DEFS})
  endif()
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)
endfunction()

# The float64 twin of a library (decision 0067): the product instantiates its templated ops,
# kernels and model for float only; the finite-difference gradient tests need them in float64.
# With the tests configured, the twin <product>_float64 compiles the given SOURCES of the product a
# second time with MESHRUN_FLOAT64=1 (engine/core/element_type.h: the files then instantiate
# double and leave out what is not a template) and the product's flags, definitions, include
# directories and libraries; it links the product and DEPS (other twins). Only tests link a twin,
# so nothing instantiated for double reaches the binaries.
#   meshrun_float64_twin(PRODUCT SOURCES a.cc b.cc [DEPS twin1 twin2])
function(meshrun_float64_twin product)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  if(MESHRUN_TESTS STREQUAL "OFF")
    return()
  endif()
  set(twin ${product}_float64)
  add_library(${twin} STATIC EXCLUDE_FROM_ALL ${ARG_SOURCES})
  target_compile_definitions(${twin} PRIVATE
    $<TARGET_PROPERTY:${product},COMPILE_DEFINITIONS> MESHRUN_FLOAT64=1)
  target_compile_options(${twin} PRIVATE $<TARGET_PROPERTY:${product},COMPILE_OPTIONS>)
  target_include_directories(${twin} PRIVATE $<TARGET_PROPERTY:${product},INCLUDE_DIRECTORIES>)
  target_link_libraries(${twin} PRIVATE $<TARGET_PROPERTY:${product},LINK_LIBRARIES>)
  target_link_libraries(${twin} PUBLIC ${ARG_DEPS} ${product})
endfunction()

function(meshrun_add_executable name)
  cmake_parse_arguments(ARG "" "OUTPUT_NAME" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
  if(ARG_OUTPUT_NAME)
    set_target_properties(${name} PROPERTIES OUTPUT_NAME ${ARG_OUTPUT_NAME})
  endif()
endfunction()

# The exit code of a test that skipped (GTEST_SKIP, no GPU, a tool missing) and failed nothing:
# ctest's SKIP_RETURN_CODE on every test, so a skip is reported as skipped, never as passed.
set(MESHRUN_TEST_SKIP_CODE 77)

# Tests run from the build tree with OMP_NUM_THREADS=1 (ctest runs tests side by side, and
# spinning OpenMP threads that outnumber the cores slow everything down); each gets a label
# (unit, integration, gpu) so CI and
# scripts/gpu-check can pick them with `ctest -L`. main() is tests/test_main.cc (the
# meshrun_test_main library): GTEST_SKIP makes the executable exit MESHRUN_TEST_SKIP_CODE.
#
#   meshrun_add_test_group(g)
#   meshrun_add_test(NAME SOURCES t.cc DEPS lib LABELS unit [TIMEOUT s] [GROUP g])
#
# With GROUP, the test's files join the executable g (made first by meshrun_add_test_group, in
# this directory or one above), and ctest's entry NAME runs g with --gtest_filter set to the
# suites its files define: one executable per test directory, so GoogleTest, gRPC and JSON are
# parsed and linked once per unity batch instead of once per file (decision 0030). A suite
# defined in two files of one group is a configure error; an entry whose filter matches no test
# fails (tests/test_main.cc). The binaries a grouped test runs go to add_dependencies(g …), its
# definitions to target_compile_definitions(g …).
function(meshrun_add_test_group group)
  add_executable(${group})
  target_link_libraries(${group} PRIVATE GTest::gtest meshrun_test_main)
  target_include_directories(${group} PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_options(${group} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)
  set_target_properties(${group} PROPERTIES
    RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  # In unity batches the files of a group compile together: no two may define the same
  # file-local name.
  meshrun_unity_build(TARGETS ${group})
endfunction()

function(meshrun_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT;GROUP" "SOURCES;DEPS;LABELS" ${ARGN})
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set(command ${name})
  if(ARG_GROUP)
    set(group ${ARG_GROUP})
    set(suites)
    foreach(src ${ARG_SOURCES})
      get_filename_component(abs ${src} ABSOLUTE)
      target_sources(${group} PRIVATE ${abs})
      file(STRINGS ${abs} lines REGEX "^(TEST|TEST_F|TEST_P)\\([A-Za-z0-9_]+,")
      foreach(line ${lines})
        if(line MATCHES "^TEST(_F|_P)?\\(([A-Za-z0-9_]+),")
          list(APPEND suites ${CMAKE_MATCH_2})
        endif()
      endforeach()
    endforeach()
    list(REMOVE_DUPLICATES suites)
    if(NOT suites)
      message(FATAL_ERROR
        "meshrun_add_test(${name}): no TEST/TEST_F/TEST_P at a line's start in ${ARG_SOURCES}")
    endif()
    get_property(taken GLOBAL PROPERTY MESHRUN_TEST_GROUP_${group}_SUITES)
    set(filter)
    foreach(suite ${suites})
      if(suite IN_LIST taken)
        message(FATAL_ERROR "meshrun_add_test(${name}): suite ${suite} is also defined by another "
          "test of group ${group}; rename one (a group's ctest entries select tests by suite)")
      endif()
      set_property(GLOBAL APPEND PROPERTY MESHRUN_TEST_GROUP_${group}_SUITES ${suite})
      # TEST_P suites are named Instantiation/Suite.
      string(APPEND filter "${suite}.*:*/${suite}.*:")
    endforeach()
    string(REGEX REPLACE ":$" "" filter "${filter}")
    target_link_libraries(${group} PRIVATE ${ARG_DEPS})
    set(command ${group} --gtest_filter=${filter})
  else()
    add_executable(${name} ${ARG_SOURCES})
    target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest meshrun_test_main)
    target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
    target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)
    set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  endif()
  add_test(NAME ${name} COMMAND ${command} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
    SKIP_RETURN_CODE ${MESHRUN_TEST_SKIP_CODE}
    ENVIRONMENT "MESHRUN_SOURCE_DIR=${PROJECT_SOURCE_DIR};MESHRUN_BINARY_DIR=${PROJECT_BINARY_DIR};OMP_NUM_THREADS=1")
endfunction()

# Generates C++ messages for every .proto given, and gRPC stubs for those in SERVICES (the files
# that declare a service; a stub file of a service-less proto is empty code that still parses
# all of grpcpp), into one static library.
#   meshrun_add_proto_library(NAME PROTO_ROOT dir PROTOS a.proto b.proto [SERVICES b.proto])
# PROTOS may be absolute or relative to the calling CMakeLists.txt; imports are resolved from
# PROTO_ROOT (and protoc's own include path for google/protobuf/*.proto), and headers are
# included as "<path under PROTO_ROOT>.pb.h". Each file is regenerated when any proto of the
# library changes, since a file's generated code depends on the files it imports.
function(meshrun_add_proto_library name)
  cmake_parse_arguments(ARG "" "PROTO_ROOT" "PROTOS;SERVICES" ${ARGN})
  set(out_dir ${PROJECT_BINARY_DIR}/gen)
  file(MAKE_DIRECTORY ${out_dir})
  get_filename_component(root ${ARG_PROTO_ROOT} ABSOLUTE)
  set(protos)
  foreach(proto ${ARG_PROTOS})
    get_filename_component(abs ${proto} ABSOLUTE)
    list(APPEND protos ${abs})
  endforeach()
  set(services)
  foreach(proto ${ARG_SERVICES})
    get_filename_component(abs ${proto} ABSOLUTE)
    list(APPEND services ${abs})
  endforeach()
  set(srcs)
  foreach(proto ${protos})
    file(RELATIVE_PATH rel ${root} ${proto})
    string(REGEX REPLACE "\\.proto$" "" base ${rel})
    set(gen ${out_dir}/${base}.pb.cc ${out_dir}/${base}.pb.h)
    set(grpc_args)
    if(proto IN_LIST services)
      list(APPEND gen ${out_dir}/${base}.grpc.pb.cc ${out_dir}/${base}.grpc.pb.h)
      set(grpc_args --grpc_out=${out_dir} --plugin=protoc-gen-grpc=${MESHRUN_GRPC_CPP_PLUGIN})
    endif()
    add_custom_command(
      OUTPUT ${gen}
      COMMAND ${MESHRUN_PROTOC} --proto_path=${root} --cpp_out=${out_dir} ${grpc_args} ${proto}
      DEPENDS ${protos} ${MESHRUN_PROTOC} ${MESHRUN_GRPC_CPP_PLUGIN}
      COMMENT "protoc ${rel}")
    list(FILTER gen INCLUDE REGEX "\\.cc$")
    list(APPEND srcs ${gen})
  endforeach()
  add_library(${name} STATIC ${srcs})
  target_include_directories(${name} PUBLIC ${out_dir})
  target_link_libraries(${name} PUBLIC PkgConfig::GRPCPP PkgConfig::PROTOBUF)
endfunction()

# ---- Build speed (docs/decisions/0018-build-speed.md) ----------------------------------------
#
# -O3 pays where the math runs (kernels, the model, the training step); the rest (the control
# plane, JSON and protobuf code, file formats, the planner) runs no hot loop but took most of
# the build at -O3: nlohmann::json and generated protobuf code are template-heavy, and the
# optimizer's time on them is most of their cost. These targets and files build at -O2.
#   meshrun_moderate_optimization(TARGETS t1 t2 SOURCES a.cc b.cc)
# (SOURCES: files of targets defined in the calling directory.)
function(meshrun_moderate_optimization)
  cmake_parse_arguments(ARG "" "" "TARGETS;SOURCES" ${ARGN})
  foreach(t ${ARG_TARGETS})
    target_compile_options(${t} PRIVATE $<$<AND:$<CONFIG:Release>,$<COMPILE_LANGUAGE:CXX>>:-O2>)
  endforeach()
  if(ARG_SOURCES)
    set_property(SOURCE ${ARG_SOURCES} APPEND PROPERTY COMPILE_OPTIONS $<$<CONFIG:Release>:-O2>)
  endif()
endfunction()

# A daemon's or the CLI's main.cc (flag parsing with the header-only CLI11, wiring, start-up)
# runs once: -O1, where -O2 spent 20 of the worker main's 37 s optimizing CLI11's templates.
#   meshrun_startup_optimization(SOURCES main.cc)
function(meshrun_startup_optimization)
  cmake_parse_arguments(ARG "" "" "SOURCES" ${ARGN})
  set_property(SOURCE ${ARG_SOURCES} APPEND PROPERTY COMPILE_OPTIONS $<$<CONFIG:Release>:-O1>)
endfunction()

# Unity builds (MESHRUN_UNITY_BUILD, off by default; `scripts/build --demo` and `scripts/test`
# turn it on): the files of a control-plane or file-format target are compiled a few at a time
# as one translation unit, so the headers they share (protobuf, gRPC, nlohmann::json, spdlog,
# yaml-cpp) are parsed once per batch instead of once per file. Off for plain `scripts/build`
# (development): a unity batch recompiles when any of its files changes and ccache hits only
# whole batches. Files with their own
# compile options stay out of the batches (CMake's rule).
#   meshrun_unity_build(TARGETS t1 t2 [BATCH n])
option(MESHRUN_UNITY_BUILD "Compile the non-math libraries as unity batches (a clean build's speed)" OFF)
set(MESHRUN_UNITY_BATCH 8 CACHE STRING "Files per unity batch")
function(meshrun_unity_build)
  cmake_parse_arguments(ARG "" "BATCH" "TARGETS" ${ARGN})
  if(NOT MESHRUN_UNITY_BUILD)
    return()
  endif()
  if(NOT ARG_BATCH)
    set(ARG_BATCH ${MESHRUN_UNITY_BATCH})
  endif()
  foreach(t ${ARG_TARGETS})
    set_target_properties(${t} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${ARG_BATCH})
  endforeach()
endfunction()

# Precompiled headers for the targets whose every file includes gRPC, the generated API,
# nlohmann::json and spdlog (the client commands, the coordinator, the worker): parsing those
# headers was most of each such file's time. MESHRUN_PCH=OFF turns them off (e.g. to check that
# every file includes what it uses). ccache caches these files only with
# sloppiness=pch_defines,time_macros and, for gcc, -fpch-preprocess; both are set here when
# the compiler launcher is ccache, so CI and scripts/test keep their cache hits.
option(MESHRUN_PCH "Precompiled headers for the gRPC/protobuf-heavy targets" ON)
set(MESHRUN_PCH_HEADERS
  <grpcpp/grpcpp.h> <nlohmann/json.hpp> <spdlog/spdlog.h> <chrono> <filesystem> <map>
  <memory> <mutex> <string> <vector>)
if(MESHRUN_PCH AND CMAKE_CXX_COMPILER_LAUNCHER MATCHES "ccache"
   AND NOT CMAKE_CXX_COMPILER_LAUNCHER MATCHES "CCACHE_SLOPPINESS")
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env CCACHE_SLOPPINESS=pch_defines,time_macros
      ${CMAKE_CXX_COMPILER_LAUNCHER})
endif()
#   meshrun_precompile_headers(TARGET [EXTRA <h> "h"…]): MESHRUN_PCH_HEADERS plus EXTRA.
#   meshrun_precompile_headers(TARGET REUSE_FROM OTHER): OTHER's header, built once for both
#   (the two must compile with the same flags and definitions).
function(meshrun_precompile_headers target)
  if(NOT MESHRUN_PCH)
    return()
  endif()
  cmake_parse_arguments(ARG "" "REUSE_FROM" "EXTRA" ${ARGN})
  if(ARG_REUSE_FROM)
    target_precompile_headers(${target} REUSE_FROM ${ARG_REUSE_FROM})
  else()
    target_precompile_headers(${target} PRIVATE ${MESHRUN_PCH_HEADERS} ${ARG_EXTRA})
  endif()
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_LAUNCHER MATCHES "ccache")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fpch-preprocess>)
  endif()
endfunction()
