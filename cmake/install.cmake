# What `cmake --install` puts where:
#  - libshardpoint.so (the C API and the C++ API) and include/shardpoint/, the public
#    headers (component "library"),
#    with a CMake package (find_package(shardpoint) -> shardpoint::shardpoint) and a
#    pkg-config file (pkg-config --cflags --libs shardpoint);
#  - the library and the shared libraries it needs that a Python host cannot be assumed to
#    have into shardpoint/_lib/ (component "python": the wheel's contents, see pyproject.toml),
#    found through the library's RPATH $ORIGIN.
include(CMakePackageConfigHelpers)

# DT_RPATH (not RUNPATH): it applies to the whole dependency tree loaded through the
# library, so a bundled libcurl finds its bundled dependencies too. Set at link time (build
# tree included), so the python component can copy the built file as it is.
set_target_properties(shardpoint_c PROPERTIES INSTALL_RPATH "$ORIGIN" BUILD_WITH_INSTALL_RPATH ON)
target_link_options(shardpoint_c PRIVATE -Wl,--disable-new-dtags)

# The python component: shardpoint/_lib/libshardpoint.so (stripped) and, each once under its
# soname (a wheel is a zip: no symlinks), the shared libraries it needs that a Python host
# may lack or have under another soname (fmt, isal, curl and curl's own dependencies). Not
# bundled: the C and C++ runtimes, zlib and OpenSSL, which every Python host has and which
# must be the process's one copy.
install(CODE "set(sp_strip \"${CMAKE_STRIP}\")" COMPONENT python)
install(CODE [[
  set(dest "${CMAKE_INSTALL_PREFIX}/shardpoint/_lib")
  file(MAKE_DIRECTORY "${dest}")
  file(COPY_FILE "$<TARGET_FILE:shardpoint_c>" "${dest}/libshardpoint.so")
  if(sp_strip)
    execute_process(COMMAND "${sp_strip}" --strip-debug "${dest}/libshardpoint.so")
  endif()
  file(GET_RUNTIME_DEPENDENCIES
       LIBRARIES "$<TARGET_FILE:shardpoint_c>"
       RESOLVED_DEPENDENCIES_VAR deps
       UNRESOLVED_DEPENDENCIES_VAR missing
       PRE_EXCLUDE_REGEXES
         "^ld-linux" "^libc\.so" "^libm\.so" "^libdl\.so" "^librt\.so" "^libpthread\.so"
         "^libresolv\.so" "^libstdc\+\+\.so" "^libgcc_s\.so" "^libssl\.so" "^libcrypto\.so"
         "^libz\.so")
  if(missing)
    message(FATAL_ERROR "libshardpoint.so: unresolved dependencies: ${missing}")
  endif()
  foreach(dep IN LISTS deps)
    get_filename_component(name "${dep}" NAME)
    file(REAL_PATH "${dep}" real)
    file(COPY_FILE "${real}" "${dest}/${name}")
    message(STATUS "Bundled: ${dest}/${name}")
  endforeach()
]] COMPONENT python)

install(TARGETS shardpoint_c EXPORT shardpointTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT library
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/shardpoint DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT library)
install(EXPORT shardpointTargets NAMESPACE shardpoint:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/shardpoint
        COMPONENT library)
# The exported target is named after the library file: shardpoint::shardpoint.
set_target_properties(shardpoint_c PROPERTIES EXPORT_NAME shardpoint)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/shardpointConfig.cmake.in
  ${PROJECT_BINARY_DIR}/shardpointConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/shardpoint)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/shardpointConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/shardpointConfig.cmake ${PROJECT_BINARY_DIR}/shardpointConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/shardpoint COMPONENT library)
# Relocatable: the prefix is found from where the .pc file lies (cmake --install --prefix P).
file(RELATIVE_PATH SHARDPOINT_PC_TO_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
configure_file(${PROJECT_SOURCE_DIR}/cmake/shardpoint.pc.in ${PROJECT_BINARY_DIR}/shardpoint.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/shardpoint.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT library)
