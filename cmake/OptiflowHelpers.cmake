# Per-target settings: warnings, sanitizers and visibility are applied here, never through CMAKE_CXX_FLAGS.

function(optiflow_target_settings target)
  target_compile_features(${target} PUBLIC cxx_std_20)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wconversion
                                           -Wno-sign-conversion)
  if(OPTIFLOW_WARNINGS_AS_ERRORS)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  if(OPTIFLOW_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=address,undefined -fno-omit-frame-pointer
                                             -fno-sanitize-recover=all)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
  if(OPTIFLOW_TSAN)
    # GCC refuses std::atomic_thread_fence under TSan (-Wtsan): the schedule cache's seqlocks use fences, and TSan
    # does not model them; tests/tsan.supp names the seqlock copies whose races are by design.
    target_compile_options(${target} PRIVATE -fsanitize=thread -fno-omit-frame-pointer
                                             $<$<CXX_COMPILER_ID:GNU>:-Wno-tsan>)
    target_link_options(${target} PRIVATE -fsanitize=thread)
  endif()
  if(OPTIFLOW_BUILD_FUZZERS)
    # Coverage instrumentation for libFuzzer in every library the fuzz targets link.
    target_compile_options(${target} PRIVATE -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
endfunction()

# optiflow_add_library(<component> SOURCES ... [DEPS ...] [PRIVATE_DEPS ...])
# Creates optiflow_<component> with alias optiflow::<component> and public headers in <component>/include.
function(optiflow_add_library component)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  set(target optiflow_${component})
  add_library(${target} STATIC ${ARG_SOURCES})
  add_library(optiflow::${component} ALIAS ${target})
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
                                              $<INSTALL_INTERFACE:include>)
  target_link_libraries(${target} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  optiflow_target_settings(${target})
endfunction()

# optiflow_add_test(<name> SOURCES ... DEPS ... LABELS <layer> [THREADS])
# THREADS: the suite runs threads (or processes) against shared state; its label becomes `<layer>-threads` (ctest's
# -L is a regular expression, so `-L unit` still selects it; gtest_discover_tests in CMake 3.25 cannot give a test
# two labels), and the target optiflow_threaded_tests builds every such suite (the `tsan` preset runs them under
# ThreadSanitizer).
function(optiflow_add_test name)
  cmake_parse_arguments(ARG "THREADS" "LABELS" "SOURCES;DEPS" ${ARGN})
  if(ARG_THREADS)
    set(ARG_LABELS "${ARG_LABELS}-threads")
    optiflow_threaded_test(${name})
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} optiflow_test_support GTest::gtest GTest::gmock GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE OPTIFLOW_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                                             OPTIFLOW_SAMPLES_DIR="${OPTIFLOW_SAMPLES_DIR}")
  optiflow_target_settings(${name})
  include(GoogleTest)
  gtest_discover_tests(${name} PROPERTIES LABELS "${ARG_LABELS}" DISCOVERY_TIMEOUT 60)
endfunction()

# Marks an existing test target as a threaded suite (see optiflow_add_test's THREADS).
function(optiflow_threaded_test name)
  if(NOT TARGET optiflow_threaded_tests)
    add_custom_target(optiflow_threaded_tests)
  endif()
  add_dependencies(optiflow_threaded_tests ${name})
endfunction()
