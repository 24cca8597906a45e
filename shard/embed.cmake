# SPDX-License-Identifier: MIT
# cmake -DIN=file -DOUT=header -DNAME=symbol -P embed.cmake: writes IN's bytes
# as `static const unsigned char NAME[]` (no trailing NUL) into OUT.
file(READ "${IN}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
file(WRITE "${OUT}" "/* Generated from ${IN} by shard/embed.cmake: do not edit. */\n"
  "static const unsigned char ${NAME}[] = {${bytes}};\n")
