# SPDX-License-Identifier: MIT
# kvrouter: the router's own code (request handlers, map refresh, failure
# detector, hot-key detection with its sketch, mitigations) as a library for
# tests, and the binary. kvnode and libkvclient link none of it.
add_library(kv_hotkeys STATIC hotkeys.c)
target_link_libraries(kv_hotkeys PUBLIC kv_common kv_proto)
add_library(kv_router STATIC router_admin.c router_kv.c router_hot.c router_mitigate.c
  router_probe.c router_scan.c router_stats.c router_dash.c)
target_link_libraries(kv_router PUBLIC kv_shard kv_hotkeys kv_proto kv_http kv_common)
# The dashboard page, embedded in kvrouter at build time (router_dash.c), in
# a library of its own so that copies of kv_router (tests/fuzz) link it too.
set(KV_DASH_C ${CMAKE_CURRENT_BINARY_DIR}/dashboard_html.c)
add_custom_command(OUTPUT ${KV_DASH_C}
  COMMAND ${CMAKE_COMMAND} -DIN=${CMAKE_CURRENT_SOURCE_DIR}/dashboard.html -DOUT=${KV_DASH_C}
          -DNAME=dashboard_html -P ${CMAKE_CURRENT_SOURCE_DIR}/embed.cmake
  DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/dashboard.html ${CMAKE_CURRENT_SOURCE_DIR}/embed.cmake
  COMMENT "embedding shard/dashboard.html")
add_library(kv_dash_page STATIC ${KV_DASH_C})
target_link_libraries(kv_router PUBLIC kv_dash_page)
add_executable(kvrouter router_main.c)
target_link_libraries(kvrouter PRIVATE kv_router)
include(GNUInstallDirs)
install(TARGETS kvrouter RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
