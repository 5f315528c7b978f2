# SPDX-License-Identifier: Apache-2.0
# The layer rule of src/ (README, "Layout"): no file includes, or calls, a
# layer above its own (scripts/layers.py; the known cuts still to make are
# in scripts/layers.allow, a list that may only shrink).
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  add_test(NAME layers COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/scripts/layers.py
                                --objects ${CMAKE_BINARY_DIR})
  set_tests_properties(layers PROPERTIES LABELS "layers;no-tsan" TIMEOUT 120)
  # The check fails when a file includes a header of a layer above it: a
  # planted include of the engine's header from the utilities.
  add_test(NAME layers_refuses_upward_include
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/scripts/layers.py
                   --plant src/util/net.c=engine/engine.h)
  set_tests_properties(layers_refuses_upward_include PROPERTIES LABELS "layers;no-tsan" TIMEOUT 60
                       PASS_REGULAR_EXPRESSION "include up: src/util/net.c -> src/engine/engine.h")
endif()
