// kvpack::registry::make_pool, compiled once. Every pool-capable policy of the registry's table
// (about 34 PagedCache types and their single-sequence KVCache twins) is instantiated here, so
// the programs that link the CMake target kvpack::registry (kvpack_c, kvpack-engine, the tests)
// each see only the declaration (KVPACK_REGISTRY_COMPILED, include/kvpack/registry/registry.hpp)
// instead of compiling all of them again.
#define KVPACK_REGISTRY_IMPLEMENTATION
#include "kvpack/registry/registry.hpp"
