# Checks that libllm.so exports exactly the functions llm.h declares: every
# `LLM_API ... llm_name(` of the header is a defined dynamic function symbol,
# and no other symbol is exported (no leaked C++ internals, no data). Also
# checks the SONAME. Run as:
#   cmake -DLIB=<libllm.so> -DHEADER=<llm.h> -DNM=<nm> [-DOBJDUMP=<objdump>] [-DSONAME=libllm.so.0] -P check_exports.cmake
cmake_minimum_required(VERSION 3.16)
foreach(var LIB HEADER NM)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_exports.cmake: -D${var}=... is required")
  endif()
endforeach()

# ---- functions the header declares
file(READ "${HEADER}" header)
# Drop comments so that prose mentioning llm_* cannot count.
string(REGEX REPLACE "/\\*([^*]|\\*+[^*/])*\\*+/" " " header "${header}")
string(REGEX REPLACE "//[^\n]*" " " header "${header}")
string(REGEX MATCHALL "LLM_API[ \t\r\n]+[A-Za-z_][A-Za-z0-9_ \t\r\n*]*[ \t\r\n*]llm_[A-Za-z0-9_]+[ \t\r\n]*\\("
       decls "${header}")
set(declared "")
foreach(decl IN LISTS decls)
  string(REGEX MATCH "llm_[A-Za-z0-9_]+[ \t\r\n]*\\($" name "${decl}")
  string(REGEX REPLACE "[ \t\r\n]*\\($" "" name "${name}")
  list(APPEND declared ${name})
endforeach()
list(REMOVE_DUPLICATES declared)
list(LENGTH declared n_declared)
if(n_declared LESS 10)
  message(FATAL_ERROR "parsed only ${n_declared} declarations from ${HEADER}: the parser needs fixing")
endif()

# ---- symbols the library exports
execute_process(COMMAND "${NM}" -D --defined-only "${LIB}"
                OUTPUT_VARIABLE nm_out ERROR_VARIABLE nm_err RESULT_VARIABLE nm_rc)
if(NOT nm_rc EQUAL 0)
  message(FATAL_ERROR "${NM} -D --defined-only ${LIB} failed: ${nm_err}")
endif()
string(REPLACE "\n" ";" nm_lines "${nm_out}")
set(exported_functions "")
set(unexpected "")
foreach(line IN LISTS nm_lines)
  if(NOT line MATCHES "^[0-9a-fA-F]* *([A-Za-z]) +([^ ]+)$")
    continue()
  endif()
  set(type "${CMAKE_MATCH_1}")
  string(REGEX REPLACE "@.*$" "" sym "${CMAKE_MATCH_2}") # strip @@LLM_0 version suffixes
  if(type STREQUAL "A")
    continue() # version-node definitions such as LLM_0
  endif()
  if(type MATCHES "^[TtWi]$" AND sym IN_LIST declared)
    list(APPEND exported_functions ${sym})
  else()
    list(APPEND unexpected "${sym} (${type})")
  endif()
endforeach()

set(missing "")
foreach(name IN LISTS declared)
  if(NOT name IN_LIST exported_functions)
    list(APPEND missing ${name})
  endif()
endforeach()

set(ok TRUE)
if(missing)
  string(REPLACE ";" "\n  " m "${missing}")
  message(SEND_ERROR "declared in llm.h but not exported by ${LIB}:\n  ${m}")
  set(ok FALSE)
endif()
if(unexpected)
  string(REPLACE ";" "\n  " u "${unexpected}")
  message(SEND_ERROR "exported by ${LIB} but not declared in llm.h:\n  ${u}")
  set(ok FALSE)
endif()

if(DEFINED OBJDUMP AND DEFINED SONAME AND OBJDUMP)
  execute_process(COMMAND "${OBJDUMP}" -p "${LIB}" OUTPUT_VARIABLE dump RESULT_VARIABLE rc)
  if(NOT dump MATCHES "SONAME +([^ \n]+)")
    message(SEND_ERROR "${LIB} has no SONAME")
    set(ok FALSE)
  elseif(NOT CMAKE_MATCH_1 STREQUAL SONAME)
    message(SEND_ERROR "SONAME is ${CMAKE_MATCH_1}, expected ${SONAME}")
    set(ok FALSE)
  endif()
endif()

if(NOT ok)
  message(FATAL_ERROR "export check failed")
endif()
list(LENGTH exported_functions n)
message(STATUS "libllm exports exactly the ${n} functions of llm.h")
