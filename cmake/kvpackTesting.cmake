# Test plumbing shared by tests/, bench/, examples/ and tools/. Included by the top-level
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

# kvpack_program(<name> <sources>...)
#
# A program of the build (benchmark, example, tool, or a test that needs the real model or a
# redis-server): add_executable, or, with KVPACK_CHECK_ONLY_UNRUN, an object library whose sources
# go through the compiler's front end only (cmake/syntax_only.sh: every template instantiated,
# the warnings as errors, no code; a quarter of the CPU of clang++ -O0 with the sanitizers). The
# asan-ubsan preset sets it: that stage runs none of these programs (the model and remote labels
# run in their own stages on the gcc-release build), so compiling them with the sanitizers only
# bought clang++'s warnings and a link. gcc-release still links the examples, tools and tests;
# the benchmarks then link nowhere in CI (gcc-release does not build them; bench/run_bench.sh
# does). Callers register tests or POST_BUILD steps only when it is OFF (nothing is linked).
option(KVPACK_CHECK_ONLY_UNRUN "Benchmarks, examples, tools, model and remote tests: front-end check only, no link" OFF)
function(kvpack_program name)
  if(KVPACK_CHECK_ONLY_UNRUN)
    add_library(${name} OBJECT ${ARGN})
    set_target_properties(${name} PROPERTIES CXX_COMPILER_LAUNCHER ${PROJECT_SOURCE_DIR}/cmake/syntax_only.sh)
  else()
    add_executable(${name} ${ARGN})
  endif()
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

# kvpack_add_gtest_group(<name> SOURCES <test_x.cpp>... [LABEL unit|tsan] [LIBRARIES <lib>...])
#
# Several GoogleTest files compiled into ONE executable <name>, as a unity build (CMake's
# UNITY_BUILD: the files are #included into batches of KVPACK_TEST_UNITY_BATCH, so the headers
# are parsed and their templates instantiated and optimised once per batch rather than once per
# file, which is most of the compile time of this header-only library). Its ctest tests keep
# the names they had with one executable per file, "<file stem>.<Suite>.<Test>" (discovered at
# ctest time from GoogleTest's JSON list, which records each test's source file:
# cmake/kvpackDiscoverTests.cmake). For each source test_x.cpp there is also
#   - a target test_x that builds the group (so `cmake --build ... --target test_x` works), and
#   - a link <build>/tests/test_x -> <name>, which runs only the tests of test_x.cpp
#     (tests/support/grouped_main.cpp).
# Files in one batch share one translation unit: their anonymous-namespace names must differ.
set(KVPACK_TEST_UNITY_BATCH 8 CACHE STRING "tests/test_*.cpp per unity translation unit")
function(kvpack_add_gtest_group name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "LABEL" "SOURCES;LIBRARIES")
  if(NOT arg_LABEL)
    set(arg_LABEL unit)
  endif()
  if(NOT arg_LABEL MATCHES "^(unit|tsan)$")
    message(FATAL_ERROR "kvpack_add_gtest_group(${name}): LABEL must be unit or tsan")
  endif()
  if(NOT TARGET kvpack_grouped_main)   # main() of every group, compiled once
    add_library(kvpack_grouped_main STATIC ${PROJECT_SOURCE_DIR}/tests/support/grouped_main.cpp)
    target_link_libraries(kvpack_grouped_main PUBLIC GTest::gtest Threads::Threads PRIVATE kvpack_warnings)
    target_compile_features(kvpack_grouped_main PRIVATE cxx_std_20)
  endif()
  add_executable(${name} ${arg_SOURCES})
  set_target_properties(${name} PROPERTIES
    UNITY_BUILD ON UNITY_BUILD_MODE BATCH UNITY_BUILD_BATCH_SIZE ${KVPACK_TEST_UNITY_BATCH})
  target_link_libraries(${name} PRIVATE kvpack::kvpack kvpack_warnings kvpack_grouped_main ${arg_LIBRARIES})
  if(arg_LABEL STREQUAL "tsan")
    add_dependencies(kvpack_tsan_tests ${name})
  endif()

  # Per-file names: a target that builds the group and a link that runs the file's tests.
  set(links "")
  foreach(src IN LISTS arg_SOURCES)
    get_filename_component(stem ${src} NAME_WE)
    add_custom_target(${stem} DEPENDS ${name})
    list(APPEND links COMMAND ${CMAKE_COMMAND} -E create_symlink $<TARGET_FILE_NAME:${name}>
                              $<TARGET_FILE_DIR:${name}>/${stem})
  endforeach()
  add_custom_command(TARGET ${name} POST_BUILD ${links} VERBATIM)

  # ctest-time discovery (like gtest_discover_tests' PRE_TEST mode), named after the files.
  set(ctest_file "${CMAKE_CURRENT_BINARY_DIR}/${name}_tests.cmake")
  set(include_file "${CMAKE_CURRENT_BINARY_DIR}/${name}_include.cmake")
  get_property(emulator TARGET ${name} PROPERTY CROSSCOMPILING_EMULATOR)
  file(GENERATE OUTPUT "${include_file}" CONTENT
"set(_kvpack_exe [==[$<TARGET_FILE:${name}>]==])
if(EXISTS \"\${_kvpack_exe}\")
  if(NOT EXISTS [==[${ctest_file}]==] OR NOT [==[${ctest_file}]==] IS_NEWER_THAN \"\${_kvpack_exe}\"
     OR NOT [==[${ctest_file}]==] IS_NEWER_THAN \"\${CMAKE_CURRENT_LIST_FILE}\")
    set(_kvpack_emulator [==[${emulator}]==])
    set(_kvpack_workdir [==[${CMAKE_CURRENT_BINARY_DIR}]==])
    set(_kvpack_properties [==[LABELS;${arg_LABEL}]==])
    set(_kvpack_timeout 120)
    set(_kvpack_ctest_file [==[${ctest_file}]==])
    include([==[${PROJECT_SOURCE_DIR}/cmake/kvpackDiscoverTests.cmake]==])
    kvpack_discover_tests()
  endif()
  include([==[${ctest_file}]==])
else()
  add_test(${name}_NOT_BUILT ${name}_NOT_BUILT)
endif()
")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${include_file}")
endfunction()
