# ctest zrl_client_install: installs this build into a scratch prefix, then
# builds csrc/examples/consumer (an out-of-tree project) against it through
#   1. the CMake package: find_package(zrl_client CONFIG) + zrl::client and
#      zrl::client_static, and
#   2. pkg-config: c++ main.cc $(pkg-config --cflags --libs zrl_client),
# and runs each program (it must catch a zrl::TimeoutError from the library).
# Run by ctest as: cmake -DZRL_BUILD_DIR=... -DZRL_SOURCE_DIR=... -DZRL_SCRATCH_DIR=...
#   -DZRL_LIBDIR=... -DZRL_GENERATOR=... -DZRL_MAKE_PROGRAM=... -DZRL_CXX_COMPILER=... -P this file
cmake_minimum_required(VERSION 3.18)

foreach(var ZRL_BUILD_DIR ZRL_SOURCE_DIR ZRL_SCRATCH_DIR ZRL_LIBDIR ZRL_GENERATOR ZRL_CXX_COMPILER)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "client_install_test.cmake: -D${var}=... is required")
  endif()
endforeach()

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${what}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

set(prefix ${ZRL_SCRATCH_DIR}/prefix)
set(consumer_build ${ZRL_SCRATCH_DIR}/consumer-build)
file(REMOVE_RECURSE ${ZRL_SCRATCH_DIR})
file(MAKE_DIRECTORY ${ZRL_SCRATCH_DIR})

run_step("cmake --install" ${CMAKE_COMMAND} --install ${ZRL_BUILD_DIR} --prefix ${prefix})
foreach(f include/zrl/client.h include/zrl/wire_format.h ${ZRL_LIBDIR}/cmake/zrl_client/zrl_clientConfig.cmake
          ${ZRL_LIBDIR}/pkgconfig/zrl_client.pc ${ZRL_LIBDIR}/libzrl_client.a)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "the install lacks ${f}")
  endif()
endforeach()

# 1. The CMake package.
set(configure_args -S ${ZRL_SOURCE_DIR}/csrc/examples/consumer -B ${consumer_build}
    -G ${ZRL_GENERATOR} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${ZRL_CXX_COMPILER}
    -DCMAKE_BUILD_TYPE=Release)
if(ZRL_MAKE_PROGRAM)
  list(APPEND configure_args -DCMAKE_MAKE_PROGRAM=${ZRL_MAKE_PROGRAM})
endif()
run_step("configure the consumer" ${CMAKE_COMMAND} ${configure_args})
run_step("build the consumer" ${CMAKE_COMMAND} --build ${consumer_build})
run_step("run consumer (zrl::client)" ${consumer_build}/consumer)
run_step("run consumer_static (zrl::client_static)" ${consumer_build}/consumer_static)

# The shared consumer must load the installed library, not the build tree's.
find_program(LDD ldd)
if(LDD)
  run_step("ldd consumer" ${LDD} ${consumer_build}/consumer)
  string(REGEX MATCH "libzrl_client[^\n]*" line "${step_output}")
  if(NOT line MATCHES "${prefix}")
    message(FATAL_ERROR "consumer does not load the installed libzrl_client: ${line}")
  endif()
endif()

# 2. pkg-config.
find_program(PKG_CONFIG pkg-config)
if(NOT PKG_CONFIG)
  message(STATUS "pkg-config not found: skipping the pkg-config check")
  return()
endif()
set(ENV{PKG_CONFIG_PATH} ${prefix}/${ZRL_LIBDIR}/pkgconfig)
run_step("pkg-config" ${PKG_CONFIG} --cflags --libs zrl_client)
string(STRIP "${step_output}" flags)
separate_arguments(flags UNIX_COMMAND "${flags}")
run_step("compile with pkg-config flags" ${ZRL_CXX_COMPILER} -std=c++17
         ${ZRL_SOURCE_DIR}/csrc/examples/consumer/main.cc ${flags}
         -Wl,-rpath,${prefix}/${ZRL_LIBDIR} -o ${ZRL_SCRATCH_DIR}/consumer_pkgconfig)
run_step("run consumer_pkgconfig" ${ZRL_SCRATCH_DIR}/consumer_pkgconfig)
