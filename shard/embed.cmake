# SPDX-License-Identifier: MIT
# cmake -DIN=file -DOUT=source.c -DNAME=symbol -P embed.cmake: writes IN's
# bytes as `const unsigned char NAME[]` and its length as `NAME_len` (no
# trailing NUL) into the C file OUT.
file(READ "${IN}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
file(WRITE "${OUT}" "/* Generated from ${IN} by shard/embed.cmake: do not edit. */\n"
  "#include <stddef.h>\n"
  "const unsigned char ${NAME}[] = {${bytes}};\n"
  "const size_t ${NAME}_len = sizeof(${NAME});\n")
