# Every option of the project, in one place, with an OPTIFLOW_ prefix.
if(CMAKE_SOURCE_DIR STREQUAL PROJECT_SOURCE_DIR)
  set(OPTIFLOW_MASTER_PROJECT ON)
else()
  set(OPTIFLOW_MASTER_PROJECT OFF)
endif()

option(OPTIFLOW_BUILD_TESTS "Build the tests" ${OPTIFLOW_MASTER_PROJECT})
option(OPTIFLOW_BUILD_BENCH "Build the benchmarks" ${OPTIFLOW_MASTER_PROJECT})
option(OPTIFLOW_BUILD_FUZZERS "Build libFuzzer targets (needs clang)" OFF)
# OFF for a consumer's plain build (a compiler's false positive, such as GCC 12's -Wrestrict inside std::string at -O3,
# must not break a packager's build); the project's presets and CI turn it ON.
option(OPTIFLOW_WARNINGS_AS_ERRORS "Treat warnings as errors on OptiFlow targets" OFF)
option(OPTIFLOW_SANITIZE "Build OptiFlow targets with AddressSanitizer and UBSan" OFF)
option(OPTIFLOW_TSAN "Build OptiFlow targets with ThreadSanitizer" OFF)
if(OPTIFLOW_SANITIZE AND OPTIFLOW_TSAN)
  message(FATAL_ERROR "OPTIFLOW_SANITIZE (ASan/UBSan) and OPTIFLOW_TSAN cannot be combined in one build")
endif()
set(OPTIFLOW_CUDA_ROOT "/usr/local/cuda" CACHE PATH "Where to look for CUDA and NCCL (optional)")

function(optiflow_print_summary)
  message(STATUS "OptiFlow ${PROJECT_VERSION} configuration:")
  foreach(opt OPTIFLOW_BUILD_TESTS OPTIFLOW_BUILD_BENCH OPTIFLOW_BUILD_FUZZERS OPTIFLOW_WARNINGS_AS_ERRORS
              OPTIFLOW_SANITIZE OPTIFLOW_TSAN OPTIFLOW_HAVE_CUDA OPTIFLOW_HAVE_NCCL OPTIFLOW_HAVE_IBVERBS)
    message(STATUS "  ${opt} = ${${opt}}")
  endforeach()
endfunction()
