# Test helpers shared by tests/, bench/ and examples/. Included by the top-level CMakeLists.txt
# when KVPACK_BUILD_TESTS is on.
#
# ctest labels (the CI stages select tests by label; see README "Test labels"):
#   unit       tests/test_*.cpp, every stage
#   tsan       unit tests whose executable name matches KVPACK_TSAN_TEST_REGEX; the TSan stage
#              builds and runs only these
#   cuda       tests/cuda/*.cu; exit 77 (skipped) when no GPU is present
#   packaging  install + find_package / add_subdirectory consumers (own CI stage)
#   readme     the README's example, compiled and run
#   model      needs a real model (KVPACK_MODEL); exit 77 (skipped) when it is absent; excluded
#              from every stage but the model stage

# Exit code that means "skipped" to ctest (same as automake's).
set(KVPACK_SKIP_RETURN_CODE 77)

# kvpack_add_model_test(NAME <name> COMMAND <cmd> [args...] [TIMEOUT <s>] [LABELS <extra>...])
#
# A test that needs the real model. It finds the model through the environment variable
# KVPACK_MODEL (path of the GGUF file, as printed by examples/fetch_model.sh) and must exit
# 77 when KVPACK_MODEL is unset or the file is missing, so a build without the model reports
# it as skipped, not failed. Labelled `model`; default timeout 900 s.
function(kvpack_add_model_test)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "NAME;TIMEOUT" "COMMAND;LABELS")
  if(NOT arg_NAME OR NOT arg_COMMAND)
    message(FATAL_ERROR "kvpack_add_model_test: NAME and COMMAND are required")
  endif()
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 900)
  endif()
  add_test(NAME ${arg_NAME} COMMAND ${arg_COMMAND})
  set_tests_properties(${arg_NAME} PROPERTIES
    LABELS "model;${arg_LABELS}"
    SKIP_RETURN_CODE ${KVPACK_SKIP_RETURN_CODE}
    TIMEOUT ${arg_TIMEOUT})
endfunction()

# kvpack_add_cuda_executable(<name> <sources>...)
#
# An executable compiled by nvcc with kvpack's warnings as errors. It is added to the
# kvpack_cuda_all target, which the CUDA CI stage builds. Only valid when KVPACK_ENABLE_CUDA.
function(kvpack_add_cuda_executable name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE kvpack::kvpack kvpack_warnings)
  set_property(GLOBAL APPEND PROPERTY KVPACK_CUDA_TARGETS ${name})
endfunction()
