# Every option of the project, in one place, with an OPTIFLOW_ prefix.
if(CMAKE_SOURCE_DIR STREQUAL PROJECT_SOURCE_DIR)
  set(OPTIFLOW_MASTER_PROJECT ON)
else()
  set(OPTIFLOW_MASTER_PROJECT OFF)
endif()

option(OPTIFLOW_BUILD_TESTS "Build the tests" ${OPTIFLOW_MASTER_PROJECT})
option(OPTIFLOW_BUILD_BENCH "Build the benchmarks" ${OPTIFLOW_MASTER_PROJECT})
option(OPTIFLOW_BUILD_FUZZERS "Build libFuzzer targets (needs clang)" OFF)
option(OPTIFLOW_WARNINGS_AS_ERRORS "Treat warnings as errors on OptiFlow targets" ON)
option(OPTIFLOW_SANITIZE "Build OptiFlow targets with AddressSanitizer and UBSan" OFF)
set(OPTIFLOW_CUDA_ROOT "/usr/local/cuda" CACHE PATH "Where to look for CUDA and NCCL (optional)")

function(optiflow_print_summary)
  message(STATUS "OptiFlow ${PROJECT_VERSION} configuration:")
  foreach(opt OPTIFLOW_BUILD_TESTS OPTIFLOW_BUILD_BENCH OPTIFLOW_BUILD_FUZZERS OPTIFLOW_WARNINGS_AS_ERRORS
              OPTIFLOW_SANITIZE OPTIFLOW_HAVE_CUDA OPTIFLOW_HAVE_NCCL OPTIFLOW_HAVE_IBVERBS)
    message(STATUS "  ${opt} = ${${opt}}")
  endforeach()
endfunction()
