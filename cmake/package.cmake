# The Debian package (`make deb`): CPack's DEB generator over the install rules. With
# DELTAFIN_PACKAGE=ON (and CMAKE_INSTALL_PREFIX=/usr, as `make deb` configures) the install also
# holds the Python package (ctypes over the system libdeltafin.so.1, linked beside it), the
# documentation and the `deltafin-serve` systemd unit with its defaults file; the package's
# postinst creates the unprivileged `deltafin` user (packaging/). Runtime dependencies come from
# dpkg-shlibdeps (what the binary and the library really link), so they follow the build.
option(DELTAFIN_PACKAGE "Also install the Python package, the docs and the systemd unit (make deb)" OFF)
if(NOT DELTAFIN_PACKAGE)
  return()
endif()
include(GNUInstallDirs)
set(DELTAFIN_PYTHON_DIR lib/python3/dist-packages)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/deltafin DESTINATION ${DELTAFIN_PYTHON_DIR}
  PATTERN __pycache__ EXCLUDE)
# The Python package loads libdeltafin.so from its own folder (python/deltafin/_capi.py): a
# relative link to the system library instead of a copy.
file(RELATIVE_PATH DELTAFIN_PY_TO_LIB ${CMAKE_INSTALL_PREFIX}/${DELTAFIN_PYTHON_DIR}/deltafin
  ${CMAKE_INSTALL_FULL_LIBDIR}/libdeltafin.so.1)
install(CODE "file(CREATE_LINK ${DELTAFIN_PY_TO_LIB}
  \"\$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}/${DELTAFIN_PYTHON_DIR}/deltafin/libdeltafin.so\" SYMBOLIC)")
file(GLOB DELTAFIN_DOCS ${PROJECT_SOURCE_DIR}/docs/*.md)
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/SECURITY.md ${DELTAFIN_DOCS}
  DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR} RENAME copyright)
# Debian 12's place for a package's units (debhelper's too), whatever the prefix.
install(FILES ${PROJECT_SOURCE_DIR}/packaging/deltafin-serve.service
  DESTINATION /lib/systemd/system)
install(FILES ${PROJECT_SOURCE_DIR}/packaging/deltafin-serve.default
  DESTINATION ${CMAKE_INSTALL_FULL_SYSCONFDIR}/default RENAME deltafin-serve)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME deltafin)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "Deltafin maintainers <deltafin@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "Kimi K3 on one machine, exactly, from the original checkpoint")
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION "Kimi K3 on one machine, exactly, from the original checkpoint
 deltafin runs Moonshot AI's Kimi K3 (2.8T-parameter mixture of experts) from its released
 Hugging Face checkpoint without converting it, in RAM or streamed from an SSD under a memory
 budget: a command-line program (run, chat, serve, doctor, pull, ...), an OpenAI, Anthropic
 and Ollama compatible HTTP server (the deltafin-serve systemd unit), a C library with its
 header and pkg-config file, and a Python package over it.")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "python3, python3-numpy, libvulkan1")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
  "${PROJECT_SOURCE_DIR}/packaging/postinst;${PROJECT_SOURCE_DIR}/packaging/postrm;${PROJECT_SOURCE_DIR}/packaging/conffiles")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION TRUE)
set(CPACK_STRIP_FILES TRUE)
include(CPack)
