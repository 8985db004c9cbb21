# FindSodium: locates libsodium (https://doc.libsodium.org), which ships a pkg-config file
# (libsodium.pc) but no CMake package.
#
# Result: imported target Sodium::Sodium, variables Sodium_FOUND, Sodium_VERSION,
# Sodium_INCLUDE_DIR, Sodium_LIBRARY. Set Sodium_ROOT (or CMAKE_PREFIX_PATH) to point at a
# non-system install. pkg-config output is only used as a hint, so the usual CMake search
# (including CMAKE_FIND_ROOT_PATH when cross-compiling) decides what is found.
#
# Installed next to kvpackConfig.cmake, which uses it for the optional `offload` component.

find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(PC_Sodium QUIET libsodium)
endif()

find_path(Sodium_INCLUDE_DIR NAMES sodium.h HINTS ${PC_Sodium_INCLUDEDIR} ${PC_Sodium_INCLUDE_DIRS})
find_library(Sodium_LIBRARY NAMES sodium libsodium HINTS ${PC_Sodium_LIBDIR} ${PC_Sodium_LIBRARY_DIRS})

if(Sodium_INCLUDE_DIR AND EXISTS "${Sodium_INCLUDE_DIR}/sodium/version.h")
  file(STRINGS "${Sodium_INCLUDE_DIR}/sodium/version.h" _sodium_version_line
       REGEX "^#define[ \t]+SODIUM_VERSION_STRING[ \t]+\"[^\"]+\"")
  string(REGEX REPLACE ".*\"([^\"]+)\".*" "\\1" Sodium_VERSION "${_sodium_version_line}")
  unset(_sodium_version_line)
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Sodium
  REQUIRED_VARS Sodium_LIBRARY Sodium_INCLUDE_DIR
  VERSION_VAR Sodium_VERSION)

if(Sodium_FOUND AND NOT TARGET Sodium::Sodium)
  add_library(Sodium::Sodium UNKNOWN IMPORTED)
  set_target_properties(Sodium::Sodium PROPERTIES
    IMPORTED_LOCATION "${Sodium_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${Sodium_INCLUDE_DIR}")
endif()
mark_as_advanced(Sodium_INCLUDE_DIR Sodium_LIBRARY)
