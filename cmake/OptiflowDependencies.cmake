# Dependencies come from Debian packages (scripts/install-deps.sh), found with find_package or pkg-config.
find_package(PkgConfig REQUIRED)
find_package(fmt CONFIG REQUIRED)
find_package(spdlog CONFIG REQUIRED)
find_package(nlohmann_json 3.10 CONFIG REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(pugixml CONFIG REQUIRED)
find_package(CURL REQUIRED)
pkg_check_modules(tomlplusplus REQUIRED IMPORTED_TARGET tomlplusplus)
# Boost.Interprocess (shared-memory segment) and Boost.CRC: header-only.
find_package(Boost 1.74 CONFIG REQUIRED COMPONENTS headers)
find_package(Threads REQUIRED)

# cpp-httplib: optiflowd's /healthz and /metrics server, and the OpenAI-compatible test server of the LLM tests.
pkg_check_modules(cpphttplib REQUIRED IMPORTED_TARGET cpp-httplib)

if(OPTIFLOW_BUILD_TESTS)
  find_package(GTest CONFIG)
  if(NOT GTest_FOUND)
    include(FetchContent)
    FetchContent_Declare(googletest URL https://github.com/google/googletest/archive/refs/tags/v1.14.0.tar.gz)
    FetchContent_MakeAvailable(googletest)
  endif()
endif()
if(OPTIFLOW_BUILD_BENCH)
  find_package(benchmark CONFIG REQUIRED)
endif()

# rdma-core is optional: the RDMA transport is built only with it (libibverbs-dev).
pkg_check_modules(ibverbs IMPORTED_TARGET libibverbs)
set(OPTIFLOW_HAVE_IBVERBS ${ibverbs_FOUND})

# CUDA and NCCL are optional: detected, never required.
set(OPTIFLOW_HAVE_CUDA OFF)
set(OPTIFLOW_HAVE_NCCL OFF)
if(EXISTS "${OPTIFLOW_CUDA_ROOT}/include/cuda_runtime_api.h")
  set(OPTIFLOW_HAVE_CUDA ON)
endif()
find_path(OPTIFLOW_NCCL_INCLUDE nccl.h HINTS "${OPTIFLOW_CUDA_ROOT}/include" /usr/include)
if(OPTIFLOW_NCCL_INCLUDE)
  set(OPTIFLOW_HAVE_NCCL ON)
endif()

# Real MSCCL files used as test data; they live beside the repository, not in it.
set(OPTIFLOW_SAMPLES_DIR "${PROJECT_SOURCE_DIR}/../shared/reference/msccl-samples"
    CACHE PATH "Folder of MSCCL XML sample files used by the tests")
