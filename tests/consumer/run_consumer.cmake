# cmake -P driver for one consumer test: configure, build and run tests/consumer
# against epcomm in a fresh directory.
#
#   cmake -DMODE=<subdirectory|fetchcontent|find_package>
#         -DEPCOMM_SOURCE_DIR=<epcomm source tree> -DWORK_DIR=<scratch dir>
#         [-DGENERATOR=<gen>] [-DMAKE_PROGRAM=<path>] [-DCXX_COMPILER=<path>]
#         [-DCXX_FLAGS=<flags>] [-DBUILD_TYPE=<cfg>]
#         -P run_consumer.cmake
#
# find_package mode first configures a minimal epcomm build (no tests, examples
# or benchmarks) and installs it into WORK_DIR/prefix, then builds the consumer
# with CMAKE_PREFIX_PATH=WORK_DIR/prefix.
cmake_minimum_required(VERSION 3.25)

foreach(var MODE EPCOMM_SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()

# Settings shared by every configure: same generator and compiler as the parent.
set(common_args -DCMAKE_BUILD_TYPE=${BUILD_TYPE})
if(GENERATOR)
  list(APPEND common_args -G "${GENERATOR}")
endif()
if(MAKE_PROGRAM)
  list(APPEND common_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(CXX_COMPILER)
  list(APPEND common_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
if(DEFINED CXX_FLAGS)
  list(APPEND common_args "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}")
endif()
# Never pick up an epcomm from the user's or the system's package registry.
list(APPEND common_args
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
  -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)

function(step what)
  string(TIMESTAMP t "%H:%M:%S")
  message(STATUS "[${t}] consumer(${MODE}): ${what}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer(${MODE}): ${what} failed (${rc})")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(consumer_args
  -DEPCOMM_CONSUME_MODE=${MODE}
  "-DEPCOMM_SOURCE_DIR=${EPCOMM_SOURCE_DIR}")

if(MODE STREQUAL "find_package")
  set(prefix "${WORK_DIR}/prefix")
  step("configure epcomm for install"
    ${CMAKE_COMMAND} -S "${EPCOMM_SOURCE_DIR}" -B "${WORK_DIR}/epcomm-build" ${common_args}
      -DEPCOMM_BUILD_TESTS=OFF -DEPCOMM_BUILD_EXAMPLES=OFF -DEPCOMM_BUILD_BENCH=OFF
      -DEPCOMM_INSTALL=ON "-DCMAKE_INSTALL_PREFIX=${prefix}")
  step("build epcomm" ${CMAKE_COMMAND} --build "${WORK_DIR}/epcomm-build" --config ${BUILD_TYPE})
  step("install epcomm" ${CMAKE_COMMAND} --install "${WORK_DIR}/epcomm-build" --config ${BUILD_TYPE})
  foreach(f include/epcomm/core/error.hpp include/epcomm/core/deadline.hpp)
    if(NOT EXISTS "${prefix}/${f}")
      message(FATAL_ERROR "consumer(${MODE}): ${f} was not installed")
    endif()
  endforeach()
  file(GLOB_RECURSE config_files "${prefix}/*/epcommConfig.cmake")
  if(NOT config_files)
    message(FATAL_ERROR "consumer(${MODE}): no epcommConfig.cmake under ${prefix}")
  endif()
  list(APPEND consumer_args "-DCMAKE_PREFIX_PATH=${prefix}")
elseif(MODE STREQUAL "fetchcontent")
  # FetchContent must populate from the source dir, not redirect to find_package.
  list(APPEND consumer_args -DFETCHCONTENT_TRY_FIND_PACKAGE_MODE=NEVER)
elseif(NOT MODE STREQUAL "subdirectory")
  message(FATAL_ERROR "run_consumer.cmake: unknown MODE '${MODE}'")
endif()

set(build "${WORK_DIR}/consumer-build")
step("configure consumer"
  ${CMAKE_COMMAND} -S "${CMAKE_CURRENT_LIST_DIR}" -B "${build}" ${common_args} ${consumer_args})
if(MODE STREQUAL "find_package")
  # The package must come from the prefix just installed, nowhere else.
  file(STRINGS "${build}/CMakeCache.txt" found REGEX "^epcomm_DIR:")
  string(FIND "${found}" "${prefix}/" at)
  if(NOT at GREATER -1)
    message(FATAL_ERROR "consumer(${MODE}): epcomm found outside ${prefix}: ${found}")
  endif()
endif()
step("build consumer" ${CMAKE_COMMAND} --build "${build}" --config ${BUILD_TYPE})

find_program(exe epcomm_consumer PATHS "${build}" "${build}/${BUILD_TYPE}" NO_DEFAULT_PATH)
if(NOT exe)
  message(FATAL_ERROR "consumer(${MODE}): epcomm_consumer was not built")
endif()
step("run consumer" "${exe}")
