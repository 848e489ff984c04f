# Compiler flags shared by every blkfence target: one place for warnings and sanitizers.
add_library(blkfence_flags INTERFACE)
target_compile_options(blkfence_flags INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wsign-conversion
  -Wnon-virtual-dtor -Wold-style-cast -Wcast-align
  -Wimplicit-fallthrough -Wformat=2)
if(BLKFENCE_WERROR)
  target_compile_options(blkfence_flags INTERFACE -Werror)
endif()
if(BLKFENCE_SANITIZE)
  target_compile_options(blkfence_flags INTERFACE
    -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  target_link_options(blkfence_flags INTERFACE -fsanitize=address,undefined)
endif()
