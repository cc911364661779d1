# cmake -DREPORTS=<dir> -DLIMIT=<bytes> -P check_stack_frames.cmake
#
# Reads the ptxas reports that cmake/ptxas_report.sh left next to the kernel
# objects under REPORTS and fails when any function's stack frame exceeds
# LIMIT bytes: a kernel that copies a large argument struct into local memory
# in every thread (what `const __grid_constant__` prevents) shows up here,
# at compile time, without a GPU. Prints the largest frames either way.
file(GLOB_RECURSE reports "${REPORTS}/*.ptxas")
if(NOT reports)
  message(FATAL_ERROR "no ptxas reports under ${REPORTS}: build the kernel objects first")
endif()

set(functions 0)
set(largest 0)
set(largest_name "")
set(over "")
foreach(report IN LISTS reports)
  file(STRINGS "${report}" lines)
  set(name "")
  foreach(line IN LISTS lines)
    if(line MATCHES "Function properties for ([^ ]+)")
      set(name "${CMAKE_MATCH_1}")
    elseif(line MATCHES "^[ \t]+([0-9]+) bytes stack frame" AND name)
      set(bytes "${CMAKE_MATCH_1}")
      math(EXPR functions "${functions} + 1")
      if(bytes GREATER largest)
        set(largest ${bytes})
        set(largest_name "${name}")
      endif()
      if(bytes GREATER LIMIT)
        get_filename_component(object "${report}" NAME_WLE)
        list(APPEND over "  ${bytes} bytes: ${name} (${object})")
      endif()
      set(name "")
    endif()
  endforeach()
endforeach()

if(functions EQUAL 0)
  message(FATAL_ERROR "the ptxas reports under ${REPORTS} name no function: was -Xptxas=-v lost?")
endif()
list(LENGTH reports objects)
message(STATUS "${functions} functions in ${objects} objects; largest stack frame "
               "${largest} bytes (${largest_name}); limit ${LIMIT}")
if(over)
  list(JOIN over "\n" over)
  message(FATAL_ERROR "stack frames over ${LIMIT} bytes:\n${over}")
endif()
