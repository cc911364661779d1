# Install/export rules. Included from the top-level CMakeLists.txt (epcomm's own
# directory scope) when EPCOMM_INSTALL is ON. The targets to install are those
# registered with epcomm_install_component() (cmake/components.cmake).
include(CMakePackageConfigHelpers)

set(EPCOMM_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/epcomm"
    CACHE STRING "Where epcommConfig.cmake is installed, relative to the prefix")
mark_as_advanced(EPCOMM_INSTALL_CMAKEDIR)

get_property(_epcomm_components GLOBAL PROPERTY EPCOMM_INSTALL_COMPONENTS)
get_property(_epcomm_config_code GLOBAL PROPERTY EPCOMM_INSTALL_CONFIG_CODE)
get_property(_epcomm_found_checks GLOBAL PROPERTY EPCOMM_INSTALL_FOUND_CHECKS)
if(NOT _epcomm_components)
  message(FATAL_ERROR "epcomm install: no component registered with epcomm_install_component()")
endif()

set(_epcomm_component_names "")
foreach(_target IN LISTS _epcomm_components)
  get_target_property(_name ${_target} EXPORT_NAME)
  if(NOT _name)
    set(_name ${_target})
  endif()
  list(APPEND _epcomm_component_names ${_name})
  # Headers live in <directory that created the target>/include/.
  get_target_property(_dir ${_target} SOURCE_DIR)
  if(IS_DIRECTORY "${_dir}/include")
    install(DIRECTORY "${_dir}/include/"
            DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
            FILES_MATCHING PATTERN "*.hpp" PATTERN "*.h" PATTERN "*.ipp" PATTERN "*.cuh")
  endif()
endforeach()

install(TARGETS ${_epcomm_components} EXPORT epcommTargets)
install(EXPORT epcommTargets
        NAMESPACE epcomm::
        FILE epcommTargets.cmake
        DESTINATION "${EPCOMM_INSTALL_CMAKEDIR}")

# Substituted into epcommConfig.cmake.in.
set(EPCOMM_CONFIG_COMPONENTS "${_epcomm_component_names}")
set(EPCOMM_CONFIG_DEPENDENCIES "${_epcomm_config_code}")
set(EPCOMM_CONFIG_FOUND_CHECKS "${_epcomm_found_checks}")
configure_package_config_file(
  "${CMAKE_CURRENT_LIST_DIR}/epcommConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/epcommConfig.cmake"
  INSTALL_DESTINATION "${EPCOMM_INSTALL_CMAKEDIR}")
# Header-only: the same package serves every architecture.
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/epcommConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}"
  COMPATIBILITY SameMajorVersion
  ARCH_INDEPENDENT)
install(FILES
  "${PROJECT_BINARY_DIR}/epcommConfig.cmake"
  "${PROJECT_BINARY_DIR}/epcommConfigVersion.cmake"
  DESTINATION "${EPCOMM_INSTALL_CMAKEDIR}")

unset(_epcomm_components)
unset(_epcomm_config_code)
unset(_epcomm_found_checks)
unset(_epcomm_component_names)
unset(_target)
unset(_name)
unset(_dir)
