# Cross-compiles for AArch64 Linux with Debian's g++-aarch64-linux-gnu (GCC 12) and runs the
# results under qemu-aarch64 (Debian: qemu-user), so plain `ctest` in the build runs the ARM
# tests. Target: ARMv8.2-A with the dot-product and fp16 extensions (Neoverse N1, Graviton 2,
# Apple M1, Cortex-A76 and later), which kvpack's NEON kernels use.
#
#   cmake -S . -B build-arm --toolchain cmake/toolchain-aarch64-linux-gnu.cmake
#   (or: cmake --workflow --preset aarch64)
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(KVPACK_AARCH64_TRIPLE aarch64-linux-gnu)
set(KVPACK_AARCH64_SYSROOT /usr/${KVPACK_AARCH64_TRIPLE})

set(CMAKE_C_COMPILER ${KVPACK_AARCH64_TRIPLE}-gcc-12)
set(CMAKE_CXX_COMPILER ${KVPACK_AARCH64_TRIPLE}-g++-12)
set(CMAKE_C_FLAGS_INIT "-march=armv8.2-a+dotprod+fp16")
set(CMAKE_CXX_FLAGS_INIT "-march=armv8.2-a+dotprod+fp16")
set(CMAKE_LIBRARY_ARCHITECTURE ${KVPACK_AARCH64_TRIPLE})

# Target libraries and headers come from the cross sysroot only; programs from the host.
set(CMAKE_FIND_ROOT_PATH ${KVPACK_AARCH64_SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# `-L` points qemu's dynamic loader at the cross sysroot (ld-linux-aarch64.so.1, libstdc++).
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L ${KVPACK_AARCH64_SYSROOT})
