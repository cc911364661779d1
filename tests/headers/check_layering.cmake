# The layering rule of docs/design.md, checked on every epcomm include of every
# header under include/epcomm and transports/*/include:
#
#   core < bootstrap < transport < proxy < host, cuda < normal, low_latency
#        < hierarchical < epcomm.hpp
#
# A header may include headers of its own folder (subfolders count as the
# folder: transport/rma is transport) and of any lower layer, never of a
# higher or of a sibling one (host and cuda, normal and low_latency). A mode's
# cuda/ folder (normal/cuda, low_latency/cuda) sits above its mode and above
# cuda/: it may include both. No header outside a cuda/ folder includes one
# inside, so the host engines never depend on device code. The transports'
# own headers (transports/<name>/include/epcomm/<name>/) are transport-layer
# plugins. Fails, listing every offence, when one header breaks the rule.
#
# cmake -DEPCOMM_SOURCE_DIR=<repo> -P tests/headers/check_layering.cmake (CTest: header_layering)

if(NOT EPCOMM_SOURCE_DIR)
  message(FATAL_ERROR "check_layering: set EPCOMM_SOURCE_DIR")
endif()

# Folder -> layer. Equal numbers are siblings: neither may include the other.
set(_layer_core 0)
set(_layer_bootstrap 1)
set(_layer_transport 2)
set(_layer_proxy 3)
set(_layer_host 4)
set(_layer_cuda 4)
set(_layer_normal 5)
set(_layer_low_latency 5)
set(_layer_normal/cuda 6)
set(_layer_low_latency/cuda 6)
set(_layer_hierarchical 7)
set(_layer_umbrella 8)
set(_layer_plugin 3)  # transports/<name>: implement the transport layer, beside the proxy

# The unit a path (relative to include/, "epcomm/...") belongs to.
function(_unit_of path out)
  if(path MATCHES "^epcomm/(normal|low_latency)/cuda/")
    set(unit "${CMAKE_MATCH_1}/cuda")
  elseif(path MATCHES "^epcomm/([a-z_]+)/")
    set(unit "${CMAKE_MATCH_1}")
  elseif(path STREQUAL "epcomm/epcomm.hpp")
    set(unit umbrella)
  else()
    set(unit unknown)
  endif()
  if(NOT DEFINED _layer_${unit})
    # A transport's own folder (epcomm/shm/, epcomm/ucx/, ...).
    set(unit plugin)
  endif()
  set(${out} "${unit}" PARENT_SCOPE)
endfunction()

file(GLOB_RECURSE _headers RELATIVE "${EPCOMM_SOURCE_DIR}"
     "${EPCOMM_SOURCE_DIR}/include/epcomm/*.hpp" "${EPCOMM_SOURCE_DIR}/include/epcomm/*.cuh"
     "${EPCOMM_SOURCE_DIR}/transports/*/include/epcomm/*.hpp")
list(LENGTH _headers _count)
if(_count LESS 20)
  message(FATAL_ERROR "check_layering: found only ${_count} headers under ${EPCOMM_SOURCE_DIR}")
endif()

set(_offences "")
set(_edges 0)
foreach(header IN LISTS _headers)
  string(REGEX REPLACE "^(transports/[^/]+/)?include/" "" from "${header}")
  _unit_of("${from}" from_unit)
  if(from_unit STREQUAL "unknown")
    list(APPEND _offences "${header}: not in a layer's folder")
    continue()
  endif()
  file(STRINGS "${EPCOMM_SOURCE_DIR}/${header}" _includes REGEX "^[ \t]*#[ \t]*include[ \t]+[\"<]epcomm/")
  foreach(line IN LISTS _includes)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]+[\"<]([^\">]+)[\">].*$" "\\1" to "${line}")
    _unit_of("${to}" to_unit)
    math(EXPR _edges "${_edges} + 1")
    set(why "")
    if(to MATCHES "/cuda/" AND NOT from MATCHES "/cuda/")
      set(why "device code included outside a cuda/ folder")
    elseif(to_unit STREQUAL from_unit)
      # Same folder: always allowed.
    elseif(from_unit MATCHES "^(normal|low_latency)/cuda$" AND to_unit STREQUAL "${CMAKE_MATCH_1}")
      # A mode's cuda/ folder on its own mode.
    elseif(to_unit STREQUAL "unknown" OR _layer_${to_unit} GREATER_EQUAL _layer_${from_unit})
      set(why "${from_unit} (layer ${_layer_${from_unit}}) includes ${to_unit} (layer ${_layer_${to_unit}})")
    endif()
    if(why)
      list(APPEND _offences "${header}: #include ${to}: ${why}")
    endif()
  endforeach()
endforeach()

if(_offences)
  list(LENGTH _offences _n)
  list(JOIN _offences "\n  " _text)
  message(FATAL_ERROR "check_layering: ${_n} include(s) break the layering rule "
                      "(docs/design.md):\n  ${_text}")
endif()
message(STATUS "check_layering: ${_count} headers, ${_edges} epcomm includes, all within the rule")
