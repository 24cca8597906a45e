# SPDX-License-Identifier: MIT
# kvnode: the node library (for tests) and the binary.
add_library(kv_node STATIC server.c stats.c scan.c engine.c engine_bg.c engine_iter.c engine_nhc.c
  engine_store.c hot.c nodemap.c stream.c stream_src.c handoff.c coord.c)
target_link_libraries(kv_node PUBLIC kv_index kv_lsm kv_kallax kv_shard kv_proto kv_http kv_common)
add_executable(kvnode main.c)
target_link_libraries(kvnode PRIVATE kv_node)
target_sources(kv_node PRIVATE hints.c hints_seg.c)
include(GNUInstallDirs)
install(TARGETS kvnode RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
