# zerotrain.pc (C and C++) and, with the Fortran module, zerotrain-fortran.pc for Makefile codes,
# installed in <libdir>/pkgconfig (docs/install.md).
# The prefix is found from the .pc file's own place (${pcfiledir}), so the file stays right after
# `cmake --install build --prefix <elsewhere>` and when the installed tree is moved.
option(ZT_PKG_CONFIG_RPATH
       "zerotrain.pc's Libs add -Wl,-rpath,<libdir>, so that a program linked with it runs without LD_LIBRARY_PATH (OFF for distribution packages installed in the system's library directory)"
       ON)

set(_zt_pc_dir ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  message(FATAL_ERROR "zerotrain.pc: CMAKE_INSTALL_LIBDIR (${CMAKE_INSTALL_LIBDIR}) and CMAKE_INSTALL_INCLUDEDIR "
                      "(${CMAKE_INSTALL_INCLUDEDIR}) must be relative to the install prefix")
endif()
# From <prefix>/<libdir>/pkgconfig back to <prefix>: one ".." per directory level.
string(REGEX REPLACE "[^/]+" ".." ZT_PC_PREFIX_FROM_PCDIR "${_zt_pc_dir}")
set(ZT_PC_RPATH "")
if(ZT_PKG_CONFIG_RPATH)
  set(ZT_PC_RPATH "-Wl,-rpath,\${libdir} ")
endif()
set(ZT_PC_MPICC "${MPI_C_COMPILER}")
if(NOT ZT_PC_MPICC)
  set(ZT_PC_MPICC mpicc)
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/zerotrain.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/zerotrain.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/zerotrain.pc DESTINATION ${_zt_pc_dir})

if(ZT_HAVE_FORTRAN)
  set(ZT_PC_MPIFORT "${MPI_Fortran_COMPILER}")
  if(NOT ZT_PC_MPIFORT)
    set(ZT_PC_MPIFORT mpifort)
  endif()
  configure_file(${PROJECT_SOURCE_DIR}/cmake/zerotrain-fortran.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/zerotrain-fortran.pc
                 @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/zerotrain-fortran.pc DESTINATION ${_zt_pc_dir})
endif()
