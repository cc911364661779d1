# CUDA side of epcomm: the kernels' interface target (epcomm::cuda), the
# NVLink/IPC transport (epcomm::nvlink_ipc), and, in epcomm's own build, the
# GPU check program (bench/gpu) and the CUDA tests. Included once from the
# top-level CMakeLists.txt.
#
# EPCOMM_ENABLE_CUDA defaults to ON when epcomm is the top-level project and a
# CUDA compiler is found; a project that consumes epcomm through
# add_subdirectory/FetchContent sets it ON to get the CUDA targets.
# Everything is compile-only without a GPU: kernels build with nvcc for
# CMAKE_CUDA_ARCHITECTURES (default 90), and only bench/gpu/check.sh runs them.

include(CheckLanguage)
set(_epcomm_cuda_default OFF)
if(PROJECT_IS_TOP_LEVEL)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # C++20 device code needs nvcc 12.0 or newer; an older toolkit (Debian's
    # nvidia-cuda-toolkit is 11.8) leaves the CUDA path off instead of failing.
    execute_process(COMMAND "${CMAKE_CUDA_COMPILER}" --version
                    OUTPUT_VARIABLE _epcomm_nvcc_version ERROR_QUIET)
    if(_epcomm_nvcc_version MATCHES "release ([0-9]+)\\.([0-9]+)" AND CMAKE_MATCH_1 GREATER_EQUAL 12)
      set(_epcomm_cuda_default ON)
    else()
      message(STATUS "epcomm: ${CMAKE_CUDA_COMPILER} is older than CUDA 12.0; CUDA path off")
    endif()
    unset(_epcomm_nvcc_version)
  endif()
endif()
option(EPCOMM_ENABLE_CUDA "Build the CUDA kernels, the nvlink_ipc transport and the GPU checks"
       ${_epcomm_cuda_default})
unset(_epcomm_cuda_default)
if(NOT EPCOMM_ENABLE_CUDA)
  return()
endif()

if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90)
endif()
enable_language(CUDA)
# CMake < 3.26 does not know how to ask nvcc for C++20 (nvcc has accepted
# -std=c++20 since CUDA 12.0).
if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  if(CMAKE_CUDA_COMPILER_VERSION VERSION_LESS 12.0)
    message(FATAL_ERROR "epcomm's CUDA code needs C++20: nvcc 12.0 or newer "
                        "(found ${CMAKE_CUDA_COMPILER_VERSION}); or set EPCOMM_ENABLE_CUDA=OFF")
  endif()
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_EXTENSIONS OFF)
find_package(CUDAToolkit REQUIRED)

# The kernels are headers (include/epcomm/cuda/, part of epcomm::core's include
# directory); this target adds what using them needs: the CUDA runtime.
add_library(epcomm_cuda INTERFACE)
add_library(epcomm::cuda ALIAS epcomm_cuda)
set_target_properties(epcomm_cuda PROPERTIES EXPORT_NAME cuda)
target_link_libraries(epcomm_cuda INTERFACE epcomm::core CUDA::cudart)
# Tells headers that the CUDA runtime is there: the RMA transports can then
# put their buffer in device memory (transport/rma/symmetric_memory.hpp).
target_compile_definitions(epcomm_cuda INTERFACE EPCOMM_WITH_CUDA)
# QUIET: an installed epcomm stays usable without CUDA; only targets that
# link epcomm::cuda or epcomm::nvlink_ipc then need the toolkit.
epcomm_install_component(epcomm_cuda CONFIG_CODE "find_package(CUDAToolkit QUIET)")

add_subdirectory(${CMAKE_CURRENT_LIST_DIR}/../transports/nvlink_ipc
                 ${PROJECT_BINARY_DIR}/transports/nvlink_ipc)

# Warnings for the project's own CUDA targets. nvcc rejects g++'s flags and
# -Wpedantic flags the line markers of nvcc's generated host code, so CUDA
# sources get the host compiler's -Wall -Wextra (and -Werror) through
# -Xcompiler and nvcc's own warnings as errors; C++ sources get the usual set.
# EPCOMM_WARNINGS_AS_ERRORS=OFF keeps the warnings and drops the errors.
add_library(epcomm_cuda_warnings INTERFACE)
set(_epcomm_as_errors $<BOOL:${EPCOMM_WARNINGS_AS_ERRORS}>)
target_compile_options(epcomm_cuda_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra$<${_epcomm_as_errors}:,-Werror>>
  $<$<AND:$<COMPILE_LANGUAGE:CUDA>,${_epcomm_as_errors}>:-Werror=all-warnings>
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic $<${_epcomm_as_errors}:-Werror>>)
unset(_epcomm_as_errors)

if(EPCOMM_BUILD_BENCH)
  add_subdirectory(${CMAKE_CURRENT_LIST_DIR}/../bench/gpu ${PROJECT_BINARY_DIR}/bench/gpu)
endif()
