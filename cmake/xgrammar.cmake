# xgrammar's C++ core (https://github.com/mlc-ai/xgrammar, Apache-2.0) as the static library target
# `xgrammar`, built from the PyPI sdist that scripts/fetch_xgrammar.sh unpacks into .deps (run by
# scripts/setup.sh; run here too when the folder is missing). Only the C++ sources: no Python bindings,
# no tests, no cpptrace. Compiled with our compiler settings but without our warning flags (third-party).
set(DSASERVE_XGRAMMAR_VERSION 0.2.9)
set(DSASERVE_XGRAMMAR_DIR ${PROJECT_SOURCE_DIR}/.deps/xgrammar-${DSASERVE_XGRAMMAR_VERSION})
if(NOT EXISTS ${DSASERVE_XGRAMMAR_DIR}/.complete)
  message(STATUS "dsaserve: fetching xgrammar ${DSASERVE_XGRAMMAR_VERSION} (scripts/fetch_xgrammar.sh)")
  execute_process(COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/fetch_xgrammar.sh RESULT_VARIABLE _xg_rc)
  if(NOT _xg_rc EQUAL 0 OR NOT EXISTS ${DSASERVE_XGRAMMAR_DIR}/.complete)
    message(FATAL_ERROR "xgrammar source missing: run scripts/fetch_xgrammar.sh (needs network once)")
  endif()
endif()
file(GLOB_RECURSE _xg_sources CONFIGURE_DEPENDS ${DSASERVE_XGRAMMAR_DIR}/cpp/*.cc)
list(FILTER _xg_sources EXCLUDE REGEX "/cpp/tvm_ffi/")
add_library(xgrammar STATIC ${_xg_sources})
set_target_properties(xgrammar PROPERTIES CXX_STANDARD 17 CXX_EXTENSIONS OFF POSITION_INDEPENDENT_CODE ON)
target_include_directories(xgrammar SYSTEM PUBLIC ${DSASERVE_XGRAMMAR_DIR}/include
                                                  ${DSASERVE_XGRAMMAR_DIR}/3rdparty/picojson
                                                  ${DSASERVE_XGRAMMAR_DIR}/3rdparty/dlpack/include)
target_compile_definitions(xgrammar PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0 XGRAMMAR_ENABLE_INTERNAL_CHECK=0)
target_compile_options(xgrammar PRIVATE -w)
target_link_libraries(xgrammar PUBLIC Threads::Threads)
