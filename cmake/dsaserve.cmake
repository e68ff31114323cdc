# dsaserve_module(<name> SOURCES ... [CUDA_SOURCES ...] DEPS ...): the library target dsaserve_<name>.
# CUDA_SOURCES are compiled only when the CUDA toolkit was found.
function(dsaserve_module name)
  cmake_parse_arguments(M "" "" "SOURCES;CUDA_SOURCES;DEPS" ${ARGN})
  set(srcs ${M_SOURCES})
  if(DSASERVE_HAVE_CUDA)
    list(APPEND srcs ${M_CUDA_SOURCES})
  endif()
  add_library(dsaserve_${name} STATIC ${srcs})
  target_include_directories(dsaserve_${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(dsaserve_${name} PUBLIC ${M_DEPS} PRIVATE dsaserve_warnings)
  set_target_properties(dsaserve_${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()

# dsaserve_test(<name> SOURCES ... DEPS ...): one GoogleTest executable, each TEST registered with CTest.
# Tests find the fixtures through DSASERVE_FIXTURES (default ../shared/fixtures beside the repo).
function(dsaserve_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_DEPS} dsaserve_test_common GTest::gtest GTest::gtest_main
                                        dsaserve_warnings)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 900)
  endif()
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST PROPERTIES TIMEOUT ${T_TIMEOUT})
endfunction()
