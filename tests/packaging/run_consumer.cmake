# cmake -P script behind the packaging tests: (install kvpack,) configure, build and run one
# consumer project in a fresh WORK_DIR. Fails (non-zero exit) on the first step that fails.
#
# Inputs (-D): MODE (find_package | add_subdirectory), CONSUMER_SOURCE_DIR, WORK_DIR,
# KVPACK_SOURCE_DIR, KVPACK_BINARY_DIR, GENERATOR, CXX_COMPILER, CXX_COMPILER_LAUNCHER,
# EXPECT_OFFLOAD (ON when the kvpack build has kvpack::offload).
cmake_minimum_required(VERSION 3.21)

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "packaging (${MODE}): ${what} failed (${rc}): ${ARGN}")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
set(build "${WORK_DIR}/build")
set(configure_args -DCMAKE_BUILD_TYPE=Release -DEXPECT_OFFLOAD=${EXPECT_OFFLOAD})
if(CXX_COMPILER)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
endif()
if(CXX_COMPILER_LAUNCHER)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER_LAUNCHER=${CXX_COMPILER_LAUNCHER})
endif()

if(MODE STREQUAL "find_package")
  run("install" ${CMAKE_COMMAND} --install "${KVPACK_BINARY_DIR}" --prefix "${prefix}")
  foreach(f include/kvpack/result.hpp include/kvpack/config.hpp
            share/cmake/kvpack/kvpackConfig.cmake share/cmake/kvpack/kvpackConfigVersion.cmake
            share/cmake/kvpack/kvpackTargets.cmake share/cmake/kvpack/FindSodium.cmake)
    if(NOT EXISTS "${prefix}/${f}")
      message(FATAL_ERROR "packaging: ${f} missing from the install tree")
    endif()
  endforeach()
  # Only our prefix: a kvpack installed elsewhere on the machine must not satisfy the test.
  list(APPEND configure_args -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
       -DEXPECTED_KVPACK_DIR=${prefix}/share/cmake/kvpack)
elseif(MODE STREQUAL "add_subdirectory")
  list(APPEND configure_args -DKVPACK_SOURCE_DIR=${KVPACK_SOURCE_DIR})
else()
  message(FATAL_ERROR "packaging: unknown MODE '${MODE}'")
endif()

run("configure" ${CMAKE_COMMAND} -S "${CONSUMER_SOURCE_DIR}" -B "${build}" -G "${GENERATOR}" ${configure_args})
run("build" ${CMAKE_COMMAND} --build "${build}")
run("run" "${build}/consumer")
