# Packaging test, run by ctest as `cmake -P` (see tests/abi/CMakeLists.txt):
#  1. `cmake --install` the build tree (Runtime + Development components) into WORK_DIR/prefix;
#  2. check the installed layout (header, SONAME links, CMake package, llm.pc);
#  3. build tests/packaging with find_package(llm CONFIG) and run it;
#  4. build it again through pkg-config (CMake's FindPkgConfig) and run it;
#  5. build it by hand with `cc $(pkg-config --cflags --libs llm)` and run it.
# Steps 4-5 need pkg-config; without it the test prints PACKAGING_TEST_SKIPPED
# (ctest's SKIP_REGULAR_EXPRESSION) after steps 1-3 passed.
cmake_minimum_required(VERSION 3.16)
foreach(var BUILD_DIR CONSUMER_DIR WORK_DIR MODEL C_COMPILER EXPECT_VERSION)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_packaging_test.cmake: -D${var}=... is required")
  endif()
endforeach()

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "command failed (${rc}): ${cmd}\n${out}\n${err}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

set(prefix "${WORK_DIR}/prefix")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

# ---- 1. install
set(config_args "")
if(CONFIG)
  set(config_args --config "${CONFIG}")
endif()
foreach(component Runtime Development)
  run("${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}" --component ${component} ${config_args})
endforeach()

# ---- 2. layout
file(GLOB_RECURSE config_file "${prefix}/*/llmConfig.cmake")
file(GLOB_RECURSE pc_file "${prefix}/*/pkgconfig/llm.pc")
file(GLOB_RECURSE real_lib "${prefix}/*/libllm.so.${EXPECT_VERSION}")
foreach(what config_file pc_file real_lib)
  list(LENGTH ${what} n)
  if(NOT n EQUAL 1)
    message(FATAL_ERROR "expected one installed ${what}, found: '${${what}}'")
  endif()
endforeach()
if(NOT EXISTS "${prefix}/include/llm.h")
  message(FATAL_ERROR "llm.h not installed to ${prefix}/include")
endif()
get_filename_component(libdir "${real_lib}" DIRECTORY)
string(REGEX MATCH "^[0-9]+" major "${EXPECT_VERSION}")
foreach(link libllm.so libllm.so.${major})
  if(NOT IS_SYMLINK "${libdir}/${link}")
    message(FATAL_ERROR "${libdir}/${link} is not a symlink")
  endif()
endforeach()
file(READ_SYMLINK "${libdir}/libllm.so" dev_link)
file(READ_SYMLINK "${libdir}/libllm.so.${major}" soname_link)
if(NOT dev_link STREQUAL "libllm.so.${major}" OR NOT soname_link STREQUAL "libllm.so.${EXPECT_VERSION}")
  message(FATAL_ERROR "bad links: libllm.so -> ${dev_link}, libllm.so.${major} -> ${soname_link}")
endif()
file(READ "${pc_file}" pc)
if(NOT pc MATCHES "prefix=${prefix}\n" OR NOT pc MATCHES "Version: ${EXPECT_VERSION}")
  message(FATAL_ERROR "llm.pc does not describe the install prefix ${prefix}:\n${pc}")
endif()
message(STATUS "installed layout ok: ${libdir}")

# The consumers run without LD_LIBRARY_PATH: they must find the installed
# library through their own rpath, and check that they loaded it from libdir.
unset(ENV{LD_LIBRARY_PATH})
set(generator_args "")
if(GENERATOR)
  set(generator_args -G "${GENERATOR}")
endif()

function(build_and_run name)
  set(bin "${WORK_DIR}/${name}")
  run("${CMAKE_COMMAND}" -S "${CONSUMER_DIR}" -B "${bin}" ${generator_args} -DCMAKE_BUILD_TYPE=Release
      "-DCMAKE_C_COMPILER=${C_COMPILER}" ${ARGN})
  run("${CMAKE_COMMAND}" --build "${bin}")
  run("${bin}/llm_consumer" "${MODEL}" "${libdir}")
  message(STATUS "${name}: ${run_output}")
endfunction()

# ---- 3. find_package(llm CONFIG)
build_and_run(consumer-cmake "-DCMAKE_PREFIX_PATH=${prefix}" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)

# ---- 4-5. pkg-config
find_program(PKG_CONFIG_EXE NAMES pkg-config pkgconf)
if(NOT PKG_CONFIG_EXE)
  message(STATUS "find_package consumer passed; pkg-config not found: PACKAGING_TEST_SKIPPED")
  return()
endif()
get_filename_component(pc_dir "${pc_file}" DIRECTORY)
# PKG_CONFIG_LIBDIR (not _PATH) so that only this prefix is searched.
set(ENV{PKG_CONFIG_LIBDIR} "${pc_dir}")
unset(ENV{PKG_CONFIG_PATH})
build_and_run(consumer-pkgconfig-cmake -DLLM_CONSUMER_USE_PKGCONFIG=ON "-DPKG_CONFIG_EXECUTABLE=${PKG_CONFIG_EXE}")

run("${PKG_CONFIG_EXE}" --modversion llm)
string(STRIP "${run_output}" pc_version)
if(NOT pc_version STREQUAL EXPECT_VERSION)
  message(FATAL_ERROR "pkg-config --modversion llm = '${pc_version}', expected ${EXPECT_VERSION}")
endif()
run("${PKG_CONFIG_EXE}" --cflags --libs llm)
string(STRIP "${run_output}" pc_flags)
separate_arguments(pc_flags UNIX_COMMAND "${pc_flags}")
run("${C_COMPILER}" -std=c99 -Wall -Wextra -o "${WORK_DIR}/consumer-pkgconfig-cc" "${CONSUMER_DIR}/consumer.c"
    ${pc_flags} "-Wl,-rpath,${libdir}")
run("${WORK_DIR}/consumer-pkgconfig-cc" "${MODEL}" "${libdir}")
message(STATUS "consumer-pkgconfig-cc (${pc_flags}): ${run_output}")
