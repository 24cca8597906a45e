# SPDX-License-Identifier: MIT
# kvrouter: the router library (for tests) and the binary.
add_library(kv_router STATIC router_admin.c router_kv.c router_batch.c router_fan.c router_hot.c router_mitigate.c router_probe.c router_repl.c)
target_link_libraries(kv_router PUBLIC kv_shard kv_proto kv_common)
add_executable(kvrouter router_main.c)
target_link_libraries(kvrouter PRIVATE kv_router)
include(GNUInstallDirs)
install(TARGETS kvrouter RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
