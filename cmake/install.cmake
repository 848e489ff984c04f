# Install rules for the daemon and for everything that is not a compiled target: the systemd unit,
# tmpfiles.d, sysusers.d and udev files, the writer-gate drop-in and configuration examples, the
# Patroni hooks and their unit examples, the man pages and the docs. debian/ packages exactly this.
# Included at the end of the top-level CMakeLists.txt, so every target exists by then.
# (blkfencectl installs itself to sbin from cli/CMakeLists.txt.)

if(TARGET blkfenced)
  install(TARGETS blkfenced RUNTIME DESTINATION ${CMAKE_INSTALL_SBINDIR})
endif()

# The Pacemaker fence agent goes beside blkfencectl, which it runs: Pacemaker looks for fence
# agents in /usr/sbin, so a distribution package (prefix /usr) puts it where Pacemaker finds it.
install(PROGRAMS integrations/pacemaker/fence_blkfence DESTINATION ${CMAKE_INSTALL_SBINDIR})

# systemd and udev read their files from fixed "lib" directories, never from a multiarch
# CMAKE_INSTALL_LIBDIR. Installing into /usr (a distribution package) takes them from systemd.pc
# and udev.pc (Debian 12: /lib/systemd/system, /usr/lib/tmpfiles.d, /lib/udev); any other prefix
# uses PREFIX/lib/..., which systemd, systemd-tmpfiles and udev also search when the prefix is
# /usr/local. Each cache variable overrides its directory; empty (the default) means derived, and
# is derived again on every configure, so changing CMAKE_INSTALL_PREFIX takes effect.
function(blkfence_system_dir var pc_module pc_variable suffix fallback)
  set(${var} "" CACHE PATH
    "Install directory for ${fallback} files (empty: from ${pc_module}.pc or the prefix)")
  set(dir "$CACHE{${var}}")
  if(NOT dir AND CMAKE_INSTALL_PREFIX STREQUAL "/usr")
    pkg_get_variable(pc_dir ${pc_module} ${pc_variable})
    if(pc_dir)
      set(dir "${pc_dir}${suffix}")
    endif()
  endif()
  if(NOT dir)
    set(dir "${fallback}")
  endif()
  set(${var} "${dir}" PARENT_SCOPE)
endfunction()
blkfence_system_dir(BLKFENCE_SYSTEMD_UNIT_DIR systemd systemdsystemunitdir "" lib/systemd/system)
blkfence_system_dir(BLKFENCE_TMPFILES_DIR systemd tmpfilesdir "" lib/tmpfiles.d)
blkfence_system_dir(BLKFENCE_UDEV_RULES_DIR udev udevdir /rules.d lib/udev/rules.d)
blkfence_system_dir(BLKFENCE_SYSUSERS_DIR systemd sysusersdir "" lib/sysusers.d)
# The Patroni hook and rejoin scripts: programs that only Patroni and a unit run, never a user, so
# not in bin or sbin (integrations/patroni/README.md names PREFIX/lib/blkfence).
set(BLKFENCE_HELPER_DIR "lib/blkfence" CACHE PATH
  "Install directory of the Patroni hook and rejoin scripts, relative to the prefix")
set(BLKFENCE_HELPER_FULL_DIR "${CMAKE_INSTALL_PREFIX}/${BLKFENCE_HELPER_DIR}")

# The unit and the drop-in name the installed binaries (@CMAKE_INSTALL_FULL_SBINDIR@) and docs.
configure_file(systemd/blkfenced.service.in ${PROJECT_BINARY_DIR}/systemd/blkfenced.service @ONLY)
configure_file(systemd/gate-writer.conf.in ${PROJECT_BINARY_DIR}/systemd/blkfence-gate.conf @ONLY)

install(FILES ${PROJECT_BINARY_DIR}/systemd/blkfenced.service
        DESTINATION ${BLKFENCE_SYSTEMD_UNIT_DIR})
install(FILES systemd/blkfence.conf.tmpfiles
        DESTINATION ${BLKFENCE_TMPFILES_DIR} RENAME blkfence.conf)
install(FILES udev/69-blkfence.rules DESTINATION ${BLKFENCE_UDEV_RULES_DIR})
# The `blkfence` system group, the control_group that blkfence.toml.example names: created at boot
# by systemd-sysusers, and by the Debian package's postinst.
install(FILES systemd/blkfence.sysusers DESTINATION ${BLKFENCE_SYSUSERS_DIR} RENAME blkfence.conf)

install(FILES docs/man/blkfenced.8 docs/man/blkfencectl.8 docs/man/fence_blkfence.8
        DESTINATION ${CMAKE_INSTALL_MANDIR}/man8)
install(FILES docs/man/blkfence.toml.5 DESTINATION ${CMAKE_INSTALL_MANDIR}/man5)

# Examples an administrator copies and edits: the drop-in goes to
# /etc/systemd/system/WRITER.service.d/blkfence-gate.conf (systemd/README.md), the configuration
# to /etc/blkfence/blkfence.toml. OPTIONAL: the example configuration may not be written yet, and
# OPTIONAL is decided at install time, where if(EXISTS) would be frozen at configure time.
install(FILES ${PROJECT_BINARY_DIR}/systemd/blkfence-gate.conf
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)
install(FILES daemon/blkfence.toml.example
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples OPTIONAL)

# Patroni: the hooks where patroni.yml names them, the unit and drop-in as examples to copy and
# edit, configured with the installed paths like the writer-gate drop-in.
install(PROGRAMS integrations/patroni/blkfence-patroni-hook integrations/patroni/blkfence-patroni-rejoin
        DESTINATION ${BLKFENCE_HELPER_DIR})
configure_file(integrations/patroni/blkfence-patroni-rejoin@.service.in
               ${PROJECT_BINARY_DIR}/integrations/patroni/blkfence-patroni-rejoin@.service @ONLY)
configure_file(integrations/patroni/patroni.service.d/blkfence.conf.in
               ${PROJECT_BINARY_DIR}/integrations/patroni/patroni.service.d/blkfence.conf @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/integrations/patroni/blkfence-patroni-rejoin@.service
              integrations/patroni/patroni.yml.in
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples/patroni)
install(FILES ${PROJECT_BINARY_DIR}/integrations/patroni/patroni.service.d/blkfence.conf
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples/patroni/patroni.service.d)
install(FILES integrations/patroni/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples/patroni)

# docs/*.md, including design.md, which the unit's Documentation= points at.
file(GLOB blkfence_docs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/docs/*.md)
install(FILES ${blkfence_docs} DESTINATION ${CMAKE_INSTALL_DOCDIR})
