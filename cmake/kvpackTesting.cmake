# Test plumbing shared by tests/, bench/ and examples/. Included by the top-level
# CMakeLists.txt before those folders; the GoogleTest part only when KVPACK_BUILD_TESTS is on.
#
# ctest labels, one per test (the CI stages select tests by label; README "Contributing"):
#   unit       GoogleTest tests: every stage
#   tsan       GoogleTest tests that use threads (tests/test_*.cpp whose executable name
#              matches KVPACK_TSAN_TEST_REGEX, or LABEL tsan): every stage; the ThreadSanitizer
#              stage builds (target kvpack_tsan_tests) and runs only these
#   cuda       tests/cuda/*.cu; exit 77 (skipped) when no GPU is present
#   packaging  install + find_package / add_subdirectory consumers (own CI stage)
#   readme     the README's example, compiled and run
#   sanitizer  canaries that prove a sanitizer build is instrumented
#   model      needs the real model (KVPACK_MODEL_PATH); skipped when it is absent; excluded
#              from every stage but the model stage

# Exit code that means "skipped" to ctest (automake's convention).
set(KVPACK_SKIP_RETURN_CODE 77)

# kvpack_add_cuda_executable(<name> <sources>...)
#
# An executable compiled by nvcc with kvpack's warnings as errors, added to the target
# kvpack_cuda_all, which the CUDA CI stage builds. Only valid when KVPACK_ENABLE_CUDA.
function(kvpack_add_cuda_executable name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE kvpack::kvpack kvpack_warnings)
  set_property(GLOBAL APPEND PROPERTY KVPACK_CUDA_TARGETS ${name})
endfunction()

if(NOT KVPACK_BUILD_TESTS)
  return()
endif()

# GoogleTest: the system package natively; built from the Debian `googletest` source package
# when cross-compiling (there is no packaged GoogleTest for the target). Found here, at the
# top level, so GTest::gtest_main is visible in tests/ and examples/ alike.
if(CMAKE_CROSSCOMPILING)
  set(_kvpack_gtest_from_source ON)
else()
  set(_kvpack_gtest_from_source OFF)
endif()
option(KVPACK_GTEST_FROM_SOURCE "Build GoogleTest from KVPACK_GTEST_SOURCE_DIR" ${_kvpack_gtest_from_source})
set(KVPACK_GTEST_SOURCE_DIR /usr/src/googletest CACHE PATH "GoogleTest sources (Debian: googletest)")
if(KVPACK_GTEST_FROM_SOURCE)
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  set(BUILD_GMOCK ON CACHE BOOL "" FORCE)
  add_subdirectory(${KVPACK_GTEST_SOURCE_DIR} ${CMAKE_BINARY_DIR}/_deps/googletest EXCLUDE_FROM_ALL)
else()
  find_package(GTest 1.11 CONFIG REQUIRED)
endif()
include(GoogleTest)
find_package(Threads REQUIRED)

# The ThreadSanitizer stage builds this target only.
add_custom_target(kvpack_tsan_tests)

# kvpack_add_gtest(<name> SOURCES <src>... [LABEL unit|tsan|model] [LIBRARIES <lib>...]
#                  [PROPERTIES <prop> <value>...])
#
# One GoogleTest executable (no main: linked with GTest::gtest_main), with kvpack::kvpack and
# kvpack's warnings as errors. Its tests are listed at ctest time (PRE_TEST, so cross builds
# list them through the emulator and unbuilt executables break nothing) and named
# "<name>.<Suite>.<Test>". LABEL (default unit) is the one ctest label of all its tests:
#   tsan   also added to kvpack_tsan_tests, so the TSan stage builds and runs it
#   model  tests that need the real model: timeout 900 s; they must GTEST_SKIP() when
#          KVPACK_MODEL_PATH is unset or names no file; only the model stage runs them
# Use for tests outside tests/ too (examples/); tests/test_*.cpp get it automatically.
function(kvpack_add_gtest name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "LABEL" "SOURCES;LIBRARIES;PROPERTIES")
  if(NOT arg_SOURCES)
    message(FATAL_ERROR "kvpack_add_gtest(${name}): SOURCES is required")
  endif()
  if(NOT arg_LABEL)
    set(arg_LABEL unit)
  endif()
  if(NOT arg_LABEL MATCHES "^(unit|tsan|model)$")
    message(FATAL_ERROR "kvpack_add_gtest(${name}): LABEL must be unit, tsan or model")
  endif()
  add_executable(${name} ${arg_SOURCES})
  target_link_libraries(${name} PRIVATE kvpack::kvpack kvpack_warnings GTest::gtest_main ${arg_LIBRARIES})
  set(props LABELS ${arg_LABEL})
  if(arg_LABEL STREQUAL "tsan")
    add_dependencies(kvpack_tsan_tests ${name})
  elseif(arg_LABEL STREQUAL "model")
    list(APPEND props TIMEOUT 900)
  endif()
  # (one label only: gtest_discover_tests in CMake 3.25 loses the ';' of a list value)
  gtest_discover_tests(${name}
    TEST_PREFIX "${name}."
    DISCOVERY_MODE PRE_TEST
    DISCOVERY_TIMEOUT 120
    PROPERTIES ${props} ${arg_PROPERTIES})
endfunction()

# kvpack_add_model_test(NAME <name> COMMAND <cmd> [args...] [TIMEOUT <s>])
#
# A plain (non-GoogleTest) test that needs the real model, e.g. a kvpack-eval run. It finds
# the model through the environment variable KVPACK_MODEL_PATH (the GGUF file, as printed by
# examples/fetch_model.sh) and must exit 77 when that is unset or names no file, so a build
# without the model reports it as skipped. Labelled `model`; default timeout 900 s.
function(kvpack_add_model_test)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "NAME;TIMEOUT" "COMMAND")
  if(NOT arg_NAME OR NOT arg_COMMAND)
    message(FATAL_ERROR "kvpack_add_model_test: NAME and COMMAND are required")
  endif()
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 900)
  endif()
  add_test(NAME ${arg_NAME} COMMAND ${arg_COMMAND})
  set_tests_properties(${arg_NAME} PROPERTIES
    LABELS model
    SKIP_RETURN_CODE ${KVPACK_SKIP_RETURN_CODE}
    TIMEOUT ${arg_TIMEOUT})
endfunction()
