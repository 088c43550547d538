# .deb and .rpm packages with CPack (`make package`; packaging/README.md). Included last from the top CMakeLists.txt,
# after every install() rule. The packages install under /usr: configure with -DCMAKE_INSTALL_PREFIX=/usr (the
# Makefile's package target does), so that GNUInstallDirs puts the plugins in /usr/lib/<multiarch> and the config in
# /etc. The version is project(VERSION) in the top CMakeLists.txt, nothing else.
if(NOT OPTIFLOW_MASTER_PROJECT)
  return()
endif()

set(_pkg_dir "${PROJECT_SOURCE_DIR}/packaging")

# What the packages hold beyond the install rules of cli/, daemon/ and plugin/: the systemd unit (not enabled) and
# the documentation. /usr/lib/systemd/system serves both formats (merged /usr on Debian 12; RHEL's own place).
install(FILES "${_pkg_dir}/systemd/optiflowd.service" DESTINATION lib/systemd/system)
install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs FILES_MATCHING PATTERN "*.md")

if(NOT CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  message(STATUS "Packaging: CMAKE_INSTALL_PREFIX is ${CMAKE_INSTALL_PREFIX}; `make package` reconfigures with /usr")
endif()

set(CPACK_GENERATOR "DEB;RPM")
set(CPACK_PACKAGE_NAME "optiflow")
set(CPACK_PACKAGE_VENDOR "OptiFlow")
set(CPACK_PACKAGE_CONTACT "OptiFlow maintainers <optiflow@localhost>")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGE_DESCRIPTION
    "OptiFlow synthesizes collective-communication schedules for a GPU cluster and serves them to training jobs \
through NCCL's plugin interfaces: the NCCL tuner and net plugins (NCCL_TUNER_PLUGIN=optiflow, \
NCCL_NET_PLUGIN=optiflow), the optiflow command line tool and the optiflowd node daemon (systemd unit \
optiflowd.service, not enabled on install).")
set(CPACK_PACKAGE_DIRECTORY "${PROJECT_BINARY_DIR}/packages")
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_PACKAGE_RELOCATABLE OFF)  # fixed paths: /etc, /usr/lib/systemd
set(CPACK_STRIP_FILES ON)  # RelWithDebInfo binaries without their debug sections
set(CPACK_VERBATIM_VARIABLES ON)
# The staging tree is checked (no headers, no static libraries, no test binaries) and, for the .rpm, the plugins
# move from the Debian multiarch directory to /usr/lib64.
set(CPACK_PRE_BUILD_SCRIPTS "${_pkg_dir}/cpack-pre-build.cmake")
set(CPACK_OPTIFLOW_LIBDIR "${CMAKE_INSTALL_LIBDIR}")

# --- .deb ---
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # optiflow_0.1.0_amd64.deb
set(CPACK_DEBIAN_PACKAGE_SECTION "devel")
set(CPACK_DEBIAN_PACKAGE_PRIORITY "optional")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)   # Depends: from the binaries' NEEDED entries (dpkg-shlibdeps)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser")  # postinst creates the optiflow system user
# Loaded with dlopen, so dpkg-shlibdeps cannot see them: the RDMA transport needs libibverbs, the GPU probe CUDA.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "libibverbs1")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    "${_pkg_dir}/deb/conffiles;${_pkg_dir}/deb/postinst;${_pkg_dir}/deb/prerm;${_pkg_dir}/deb/postrm;\
${_pkg_dir}/deb/triggers")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

# --- .rpm ---
set(CPACK_RPM_FILE_NAME RPM-DEFAULT)  # optiflow-0.1.0-1.x86_64.rpm
set(CPACK_RPM_PACKAGE_RELEASE "1")
set(CPACK_RPM_PACKAGE_LICENSE "Proprietary")
set(CPACK_RPM_PACKAGE_GROUP "Development/Tools")
# Requires: rpmbuild's automatic ELF dependencies (sonames of fmt, spdlog, libcurl, ...), plus the user tools. No
# Suggests: libibverbs (CPack 3.25 does not detect Debian's rpmbuild as supporting the tag).
set(CPACK_RPM_PACKAGE_AUTOREQ "yes")
set(CPACK_RPM_PACKAGE_AUTOPROV "yes")
set(CPACK_RPM_PACKAGE_REQUIRES_PRE "shadow-utils")
set(CPACK_RPM_USER_FILELIST "%config(noreplace) /etc/optiflow/optiflowd.toml")
# Directories other packages own (the filesystem and systemd packages).
set(CPACK_RPM_EXCLUDE_FROM_AUTO_FILELIST_ADDITION /usr/lib/systemd /usr/lib/systemd/system /usr/share/doc)
set(CPACK_RPM_PRE_INSTALL_SCRIPT_FILE "${_pkg_dir}/rpm/pre")
set(CPACK_RPM_POST_INSTALL_SCRIPT_FILE "${_pkg_dir}/rpm/post")
set(CPACK_RPM_PRE_UNINSTALL_SCRIPT_FILE "${_pkg_dir}/rpm/preun")
set(CPACK_RPM_POST_UNINSTALL_SCRIPT_FILE "${_pkg_dir}/rpm/postun")
# The binaries are already stripped; no debuginfo subpackage and no /usr/lib/.build-id links.
set(CPACK_RPM_SPEC_MORE_DEFINE "%define _build_id_links none\n%define debug_package %{nil}")

include(CPack)
