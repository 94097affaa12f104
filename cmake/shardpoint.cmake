# sp_library(NAME SOURCES... DEPS ...): one static library per layer under src/.
# include/ (the public headers, shardpoint/*.h) is PUBLIC; src/ (every other header) is
# PRIVATE: a target that includes a layer's internal headers says so itself.
function(sp_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                     PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
endfunction()

# sp_test(NAME SOURCES... DEPS ... [LABELS ...] [FIXTURES ...]): one GoogleTest binary per
# layer, tests discovered by ctest; FIXTURES are the ctest fixtures every test requires.
function(sp_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;LABELS;FIXTURES" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} sp_launch GTest::gtest GTest::gtest_main GTest::gmock)
  target_compile_definitions(${name} PRIVATE
    SP_SOURCE_DIR="${PROJECT_SOURCE_DIR}" SP_BINARY_DIR="${PROJECT_BINARY_DIR}")
  if(ARG_FIXTURES)
    gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "${ARG_LABELS}" FIXTURES_REQUIRED "${ARG_FIXTURES}")
  else()
    gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "${ARG_LABELS}")
  endif()
endfunction()
