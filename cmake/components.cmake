# epcomm_install_component(<target> [CONFIG_CODE <line>...] [FOUND_IF <variable>])
#
# Registers an INTERFACE target of epcomm for installation. cmake/install.cmake
# (included at the end of the top-level CMakeLists.txt when EPCOMM_INSTALL is ON)
# then installs, for every registered target:
#   - the target itself, into the export set epcommTargets (as epcomm::<EXPORT_NAME>);
#   - the headers under <directory that created the target>/include/.
# CONFIG_CODE lines are copied into epcommConfig.cmake before the targets are
# imported: put there what the target's exported link interface needs, e.g.
#   epcomm_install_component(epcomm_ucx CONFIG_CODE "find_dependency(ucx)")
# FOUND_IF: the component counts as found (epcomm_<EXPORT_NAME>_FOUND) only when
# <variable> is true once the CONFIG_CODE has run. For a dependency that the
# CONFIG_CODE looks for QUIET: a consumer that does not ask for the component
# finds epcomm without it, one that requires it fails in find_package.
# Call it from the CMakeLists.txt that creates the target, once the target exists
# (a transport whose dependency is missing then simply never registers).
# Registering is harmless when EPCOMM_INSTALL is OFF.
function(epcomm_install_component target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "FOUND_IF" "CONFIG_CODE")
  if(NOT TARGET ${target})
    message(FATAL_ERROR "epcomm_install_component: no target named '${target}'")
  endif()
  get_target_property(aliased ${target} ALIASED_TARGET)
  if(aliased)
    set(target ${aliased})
  endif()
  get_property(registered GLOBAL PROPERTY EPCOMM_INSTALL_COMPONENTS)
  if(target IN_LIST registered)
    return()
  endif()
  set_property(GLOBAL APPEND PROPERTY EPCOMM_INSTALL_COMPONENTS ${target})
  foreach(line IN LISTS arg_CONFIG_CODE)
    set_property(GLOBAL APPEND_STRING PROPERTY EPCOMM_INSTALL_CONFIG_CODE "${line}\n")
  endforeach()
  if(arg_FOUND_IF)
    get_target_property(name ${target} EXPORT_NAME)
    if(NOT name)
      set(name ${target})
    endif()
    set_property(GLOBAL APPEND_STRING PROPERTY EPCOMM_INSTALL_FOUND_CHECKS
      "if(NOT ${arg_FOUND_IF})\n  set(epcomm_${name}_FOUND FALSE)\nendif()\n")
  endif()
endfunction()

# epcomm_add_transport(<name> LINK <library>... [FOUND_IF <var>] [CONFIG_CODE <line>...])
#
# A transport component, called from its directory (transports/<name>/): the
# INTERFACE target epcomm_<name> (epcomm::<name>, exported as <name>) with that
# directory's include/ as its headers, linking epcomm::core and LINK, and
# registered with epcomm_install_component() (CONFIG_CODE passed on).
function(epcomm_add_transport name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "FOUND_IF" "LINK;CONFIG_CODE")
  set(target epcomm_${name})
  add_library(${target} INTERFACE)
  add_library(epcomm::${name} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
  target_include_directories(${target} INTERFACE
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(${target} INTERFACE epcomm::core ${arg_LINK})
  epcomm_install_component(${target} CONFIG_CODE ${arg_CONFIG_CODE} FOUND_IF ${arg_FOUND_IF})
endfunction()
