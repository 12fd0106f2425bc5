# Finds meshrun's dependencies. The engine needs nothing but a compiler (OpenBLAS and CUDA are
# used when present); everything else is required unless MESHRUN_ENGINE_ONLY is on.

find_package(Threads REQUIRED)
find_package(OpenMP)

# Tests: GoogleTest when present (always on the CI machine; optional on the GPU machine,
# whose gpu tests use tests/gpu's own tiny harness).
find_package(GTest)

# --- BLAS: OpenBLAS when present; the engine has a blocked fallback GEMM otherwise.
find_path(MESHRUN_CBLAS_INCLUDE cblas.h PATHS /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/openblas /usr/include)
find_library(MESHRUN_OPENBLAS_LIB NAMES openblas)
if(MESHRUN_CBLAS_INCLUDE AND MESHRUN_OPENBLAS_LIB)
  set(MESHRUN_BLAS openblas)
else()
  set(MESHRUN_BLAS fallback)
  if(NOT MESHRUN_ENGINE_ONLY)
    message(FATAL_ERROR "OpenBLAS not found (hint: run scripts/setup, or configure with -DMESHRUN_ENGINE_ONLY=ON)")
  endif()
endif()

# --- oneDNN (optional, decision 0057): its sgemm runs the float32 GEMMs where it is found; the
# build works without it (OpenBLAS, or the fallback, then run them all).
find_path(MESHRUN_DNNL_INCLUDE oneapi/dnnl/dnnl.h)
find_library(MESHRUN_DNNL_LIB NAMES dnnl)
if(MESHRUN_DNNL_INCLUDE AND MESHRUN_DNNL_LIB AND NOT MESHRUN_NO_DNNL)
  set(MESHRUN_DNNL ON)
else()
  set(MESHRUN_DNNL OFF)
endif()

# --- nlohmann/json: header-only; required outside engine-only.
find_package(nlohmann_json 3 QUIET)
if(NOT nlohmann_json_FOUND AND NOT MESHRUN_ENGINE_ONLY)
  message(FATAL_ERROR "nlohmann-json not found (hint: run scripts/setup)")
endif()

# --- PCRE2: the tokenizers' pre-tokenizer regexes (Unicode classes); required outside
# engine-only, where text is then read as bytes only.
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(PCRE2 QUIET IMPORTED_TARGET libpcre2-8)
endif()
if(NOT PCRE2_FOUND AND NOT MESHRUN_ENGINE_ONLY)
  message(FATAL_ERROR "PCRE2 not found (hint: run scripts/setup, which installs libpcre2-dev)")
endif()

# --- CUDA and NCCL. CUDA needs nvcc; NCCL is optional on top of it: without it the NCCL backend
# (meshrun_comm_nccl) and what links it are left out, and multi-rank cuda training is refused
# at run time (engine/comm/backend_factory.h). MESHRUN_WITH_CUDA=ON makes a missing nvcc an error.
set(MESHRUN_CUDA_ENABLED OFF)
set(MESHRUN_NCCL_ENABLED OFF)
if(NOT MESHRUN_WITH_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  find_path(MESHRUN_NCCL_INCLUDE nccl.h PATHS /usr/local/cuda/include /usr/local/include /usr/include)
  find_library(MESHRUN_NCCL_LIB nccl PATHS /usr/local/cuda/lib64 /usr/local/lib /usr/lib/x86_64-linux-gnu)
  if(CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_ARCHITECTURES ${MESHRUN_CUDA_ARCHITECTURES})
    set(CMAKE_CUDA_STANDARD 20)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(MESHRUN_CUDA_ENABLED ON)
    if(MESHRUN_NCCL_INCLUDE AND MESHRUN_NCCL_LIB)
      set(MESHRUN_NCCL_ENABLED ON)
    else()
      message(STATUS "meshrun: NCCL not found: the NCCL backend and its tests are left out "
                     "(hint: set MESHRUN_NCCL_INCLUDE and MESHRUN_NCCL_LIB)")
    endif()
  elseif(MESHRUN_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MESHRUN_WITH_CUDA=ON but nvcc was not found (hint: install the CUDA toolkit under /usr/local/cuda, or use -DMESHRUN_WITH_CUDA=AUTO)")
  endif()
endif()

if(NOT MESHRUN_ENGINE_ONLY)
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(GRPCPP REQUIRED IMPORTED_TARGET grpc++)
  pkg_check_modules(PROTOBUF REQUIRED IMPORTED_TARGET protobuf)
  find_program(MESHRUN_PROTOC protoc REQUIRED)
  find_program(MESHRUN_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
  find_package(yaml-cpp REQUIRED)
  find_package(CLI11 CONFIG REQUIRED)
  find_package(spdlog REQUIRED)
  find_package(SQLite3 REQUIRED)
  # TLS files are parsed and checked at start (common/tls.cc).
  find_package(OpenSSL REQUIRED)
  find_package(prometheus-cpp CONFIG REQUIRED)
  find_package(Gloo CONFIG REQUIRED)
  if(NOT GTest_FOUND AND MESHRUN_TESTS STREQUAL "ON")
    message(FATAL_ERROR "GoogleTest not found (hint: run scripts/setup, or configure with "
                        "-DMESHRUN_TESTS=OFF to build without the tests)")
  endif()
endif()
