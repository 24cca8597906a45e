# SPDX-License-Identifier: MIT
# kvnode: the node library (for tests) and the binary.
if(TARGET kv_index AND TARGET kv_shard)
  add_library(kv_node STATIC server.c stats.c engine.c)
  target_link_libraries(kv_node PUBLIC kv_index kv_shard kv_proto kv_common)
  add_executable(kvnode main.c)
  target_link_libraries(kvnode PRIVATE kv_node)
endif()
