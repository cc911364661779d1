# epcomm_install_component(<target> [CONFIG_CODE <line>...])
#
# Registers an INTERFACE target of epcomm for installation. cmake/install.cmake
# (included at the end of the top-level CMakeLists.txt when EPCOMM_INSTALL is ON)
# then installs, for every registered target:
#   - the target itself, into the export set epcommTargets (as epcomm::<EXPORT_NAME>);
#   - the headers under <directory that created the target>/include/.
# CONFIG_CODE lines are copied into epcommConfig.cmake before the targets are
# imported: put there what the target's exported link interface needs, e.g.
#   epcomm_install_component(epcomm_ucx CONFIG_CODE "find_dependency(ucx)")
# Call it from the CMakeLists.txt that creates the target, once the target exists
# (a transport whose dependency is missing then simply never registers).
# Registering is harmless when EPCOMM_INSTALL is OFF.
function(epcomm_install_component target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "CONFIG_CODE")
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
endfunction()
