# CPACK_PRE_BUILD_SCRIPTS (cmake/OptiflowPackaging.cmake): runs in cpack on the staging tree of each package, after
# the install and before the archive is made.
#  1. Only what a node needs: no headers, no static or libtool archives, no test binaries. An install rule from a
#     dependency (e.g. googletest when it is fetched) fails the packaging here instead of shipping.
#  2. The .rpm: the plugins move from the Debian multiarch directory GNUInstallDirs gave (lib/x86_64-linux-gnu) to
#     /usr/lib64, the library directory of RPM distributions.
set(_root "${CPACK_TEMPORARY_INSTALL_DIRECTORY}")
if(NOT IS_DIRECTORY "${_root}")
  message(FATAL_ERROR "optiflow packaging: staging directory '${_root}' not found")
endif()

# A build configured for /usr/local would put the config in /usr/local/etc and the plugins in /usr/lib.
if(NOT EXISTS "${_root}/etc/optiflow/optiflowd.toml" OR NOT CPACK_OPTIFLOW_LIBDIR MATCHES "^lib")
  message(FATAL_ERROR "optiflow packaging: no /etc/optiflow/optiflowd.toml in the package: configure the build with "
                      "-DCMAKE_INSTALL_PREFIX=/usr (`make package` does)")
endif()

file(GLOB_RECURSE _all RELATIVE "${_root}" LIST_DIRECTORIES false "${_root}/*")
set(_bad "")
foreach(_f IN LISTS _all)
  if(_f MATCHES "(^|/)include/|\\.(a|la|h|hpp|cmake|pc)$|(^|/)[^/]*_test$|(^|/)gtest|(^|/)gmock|installed_plugin_check")
    list(APPEND _bad "${_f}")
  endif()
endforeach()
if(_bad)
  list(JOIN _bad "\n  " _bad_text)
  message(FATAL_ERROR "optiflow packaging: files that do not belong in the package:\n  ${_bad_text}")
endif()

if(CPACK_GENERATOR STREQUAL "RPM" AND NOT CPACK_OPTIFLOW_LIBDIR STREQUAL "lib64")
  set(_from "${_root}/usr/${CPACK_OPTIFLOW_LIBDIR}")
  if(NOT IS_DIRECTORY "${_from}")
    message(FATAL_ERROR "optiflow packaging: ${_from} not found (was the build configured with prefix /usr?)")
  endif()
  file(MAKE_DIRECTORY "${_root}/usr/lib64")
  file(GLOB _libs "${_from}/*")
  foreach(_lib IN LISTS _libs)
    get_filename_component(_name "${_lib}" NAME)
    file(RENAME "${_lib}" "${_root}/usr/lib64/${_name}")
  endforeach()
  # Remove the emptied directories up to usr/lib (which stays when it holds systemd/).
  set(_dir "${_from}")
  while(NOT _dir STREQUAL "${_root}/usr")
    file(GLOB _left "${_dir}/*")
    if(_left)
      break()
    endif()
    file(REMOVE_RECURSE "${_dir}")
    get_filename_component(_dir "${_dir}" DIRECTORY)
  endwhile()
  message(STATUS "optiflow packaging: plugins moved to /usr/lib64 for the .rpm")
endif()
