# Installation and packaging of libllm: the header, the shared library with
# its SONAME links, a CMake package (find_package(llm CONFIG) -> llm::llm)
# and a pkg-config file. Components:
#   Runtime      libllm.so.<version> and the libllm.so.<major> SONAME link
#   Development  llm.h, the libllm.so link, CMake package files, llm.pc
#   Tools        the command-line programs (llm-run, llm-convert, llm-bench)
# `cmake --install <build> --prefix <dir>` installs all of them.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Same name inside this build as for find_package users (add_subdirectory embedding).
if(NOT TARGET llm::llm)
  add_library(llm::llm ALIAS llm)
endif()

set(LLM_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/llm CACHE STRING
    "Where the CMake package files of libllm are installed (relative to the prefix)")
mark_as_advanced(LLM_INSTALL_CMAKEDIR)

install(TARGETS llm EXPORT llmTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT Runtime NAMELINK_COMPONENT Development
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT Development
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT Runtime
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_SOURCE_DIR}/include/llm.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT Development)

install(EXPORT llmTargets NAMESPACE llm:: FILE llmTargets.cmake
  DESTINATION ${LLM_INSTALL_CMAKEDIR} COMPONENT Development)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/llmConfig.cmake.in
  ${PROJECT_BINARY_DIR}/package/llmConfig.cmake
  INSTALL_DESTINATION ${LLM_INSTALL_CMAKEDIR})
# The ABI only grows (appended struct fields behind struct_size, new names),
# so a newer minor release serves an app built for an older one: 0.2 satisfies
# find_package(llm 0.1), as tests/packaging's consumer checks.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/package/llmConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/package/llmConfig.cmake ${PROJECT_BINARY_DIR}/package/llmConfigVersion.cmake
  DESTINATION ${LLM_INSTALL_CMAKEDIR} COMPONENT Development)

# llm.pc is written at install time so that its prefix is the one actually
# installed to (`cmake --install --prefix` may differ from CMAKE_INSTALL_PREFIX).
install(CODE "
set(_llm_pc_in [[${PROJECT_SOURCE_DIR}/cmake/llm.pc.in]])
set(_llm_pc_out [[${PROJECT_BINARY_DIR}/package/pkgconfig/llm.pc]])
set(_llm_libdir [[${CMAKE_INSTALL_LIBDIR}]])
set(_llm_includedir [[${CMAKE_INSTALL_INCLUDEDIR}]])
set(LLM_PC_VERSION [[${PROJECT_VERSION}]])
" COMPONENT Development)
install(CODE [[
set(LLM_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
foreach(_llm_kind libdir includedir)
  if(IS_ABSOLUTE "${_llm_${_llm_kind}}")
    set(_llm_abs "${_llm_${_llm_kind}}")
    set(_llm_pc_${_llm_kind} "${_llm_${_llm_kind}}")
  else()
    set(_llm_abs "${CMAKE_INSTALL_PREFIX}/${_llm_${_llm_kind}}")
    set(_llm_pc_${_llm_kind} "\${prefix}/${_llm_${_llm_kind}}")
  endif()
  set(_llm_abs_${_llm_kind} "${_llm_abs}")
endforeach()
set(LLM_PC_LIBDIR "${_llm_pc_libdir}")
set(LLM_PC_INCLUDEDIR "${_llm_pc_includedir}")
configure_file("${_llm_pc_in}" "${_llm_pc_out}" @ONLY)
file(INSTALL DESTINATION "${_llm_abs_libdir}/pkgconfig" TYPE FILE FILES "${_llm_pc_out}")
]] COMPONENT Development)

foreach(_llm_tool llm-run llm-convert llm-bench)
  if(TARGET ${_llm_tool})
    install(TARGETS ${_llm_tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT Tools)
  endif()
endforeach()
