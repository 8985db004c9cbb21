# ctest-time test discovery for a grouped test executable (one executable compiled from several
# tests/test_*.cpp, see kvpack_add_gtest_group in kvpackTesting.cmake). Included by the
# executable's ctest include file whenever the executable is newer than the list it wrote.
#
# Like CMake's gtest_discover_tests, but each test is named after the SOURCE FILE that defines
# it, "<file stem>.<Suite>.<Test>" (e.g. test_offload_store.OffloadStore.RoundTrip), exactly as
# when every file was its own executable, so `ctest -R test_offload_store` keeps working. The
# file comes from GoogleTest's JSON test list (--gtest_list_tests --gtest_output=json, which
# records each test's __FILE__). Names of typed and value-parameterised tests follow
# gtest_discover_tests: "Suite.Test<TypeParam>" and "Prefix/Suite.Test/<value>".
#
# Inputs (variables): _kvpack_exe, _kvpack_emulator (list, may be empty), _kvpack_workdir,
# _kvpack_properties (list of property/value pairs), _kvpack_timeout (s), _kvpack_ctest_file.

function(_kvpack_quote out value)   # a bracket argument that survives any test name
  set(eq "=")
  while(value MATCHES "\\]${eq}\\]")
    string(APPEND eq "=")
  endwhile()
  set(${out} "[${eq}[${value}]${eq}]" PARENT_SCOPE)
endfunction()

function(kvpack_discover_tests)
  set(json "${_kvpack_ctest_file}.json")
  file(REMOVE "${json}")
  execute_process(
    COMMAND ${_kvpack_emulator} "${_kvpack_exe}" --gtest_list_tests "--gtest_output=json:${json}"
    WORKING_DIRECTORY "${_kvpack_workdir}"
    TIMEOUT ${_kvpack_timeout}
    OUTPUT_VARIABLE output ERROR_VARIABLE output
    RESULT_VARIABLE result)
  if(NOT result EQUAL 0 OR NOT EXISTS "${json}")
    message(FATAL_ERROR "kvpack: listing the tests of ${_kvpack_exe} failed (${result}):\n${output}")
  endif()
  file(READ "${json}" text)

  _kvpack_quote(q_exe "${_kvpack_exe}")
  _kvpack_quote(q_dir "${_kvpack_workdir}")
  set(q_emu "")
  foreach(arg IN LISTS _kvpack_emulator)
    _kvpack_quote(q "${arg}")
    string(APPEND q_emu " ${q}")
  endforeach()
  set(q_props "")
  foreach(arg IN LISTS _kvpack_properties)
    _kvpack_quote(q "${arg}")
    string(APPEND q_props " ${q}")
  endforeach()

  set(script "")
  string(JSON n_suites LENGTH "${text}" testsuites)
  if(n_suites GREATER 0)
    math(EXPR last_suite "${n_suites} - 1")
    foreach(i RANGE ${last_suite})
      string(JSON suite GET "${text}" testsuites ${i} name)
      string(JSON n_tests LENGTH "${text}" testsuites ${i} testsuite)
      math(EXPR last_test "${n_tests} - 1")
      foreach(j RANGE ${last_test})
        string(JSON entry GET "${text}" testsuites ${i} testsuite ${j})
        string(JSON test GET "${entry}" name)
        string(JSON file GET "${entry}" file)
        get_filename_component(stem "${file}" NAME_WE)
        string(JSON type_param ERROR_VARIABLE no_type GET "${entry}" type_param)
        string(JSON value_param ERROR_VARIABLE no_value GET "${entry}" value_param)
        if(NOT no_type)   # typed test: Suite/0.Test -> Suite.Test<TypeParam>
          string(REGEX REPLACE "/.*" "" pretty_suite "${suite}")
          set(pretty "${pretty_suite}.${test}<${type_param}>")
        elseif(NOT no_value)   # value-parameterised: Prefix/Suite.Test/0 -> Prefix/Suite.Test/<value>
          string(REGEX REPLACE "/[0-9]+$" "/${value_param}" pretty_test "${test}")
          set(pretty "${suite}.${pretty_test}")
        else()
          set(pretty "${suite}.${test}")
        endif()
        string(REGEX REPLACE "(^|[./])DISABLED_" "\\1" pretty "${pretty}")
        _kvpack_quote(q_name "${stem}.${pretty}")
        _kvpack_quote(q_filter "--gtest_filter=${suite}.${test}")
        string(APPEND script
          "add_test(${q_name}${q_emu} ${q_exe} ${q_filter} --gtest_also_run_disabled_tests)\n"
          "set_tests_properties(${q_name} PROPERTIES WORKING_DIRECTORY ${q_dir}"
          " SKIP_REGULAR_EXPRESSION [==[\\[  SKIPPED \\]]==]${q_props})\n")
        if(suite MATCHES "^DISABLED_" OR test MATCHES "^DISABLED_")
          string(APPEND script "set_tests_properties(${q_name} PROPERTIES DISABLED TRUE)\n")
        endif()
      endforeach()
    endforeach()
  endif()
  file(WRITE "${_kvpack_ctest_file}" "${script}")
endfunction()
