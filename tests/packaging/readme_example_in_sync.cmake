# The README's embedding example is tests/consumer/main.cpp's text between "// [readme-example]" and
# "// [readme-example-end]" (one indent level removed): fails, showing the expected block, when the
# two drift apart, so the README never shows code the test suite does not compile and run.
file(READ ${SOURCE} source)
file(READ ${README} readme)
string(FIND "${source}" "// [readme-example]\n" begin)
string(FIND "${source}" "    // [readme-example-end]" end)
if(begin EQUAL -1 OR end EQUAL -1)
  message(FATAL_ERROR "${SOURCE} lacks the readme-example markers")
endif()
math(EXPR begin "${begin} + 20")
math(EXPR length "${end} - ${begin}")
string(SUBSTRING "${source}" ${begin} ${length} body)
string(REGEX REPLACE "(^|\n)    " "\\1" body "${body}")
string(FIND "${readme}" "```cpp\n#include <scmoe/scmoe.h>\n\n${body}```" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md's example differs from ${SOURCE}. The README should show:\n"
                      "```cpp\n#include <scmoe/scmoe.h>\n\n${body}```")
endif()
message(STATUS "README.md shows ${SOURCE}'s example")
