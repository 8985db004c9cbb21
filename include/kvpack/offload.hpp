// Umbrella header of the offload subsystem (tiers, encryption at rest, prefetch).
// Needs libsodium at link time (`pkg-config --cflags --libs libsodium`).
#pragma once

#include "kvpack/offload/block_header.hpp"
#include "kvpack/offload/block_id.hpp"
#include "kvpack/offload/block_record.hpp"
#include "kvpack/offload/cache_offload.hpp"
#include "kvpack/offload/cache_layout.hpp"
#include "kvpack/offload/crypto.hpp"
#include "kvpack/offload/file_backend.hpp"
#include "kvpack/offload/offload_store.hpp"
#include "kvpack/offload/pool_swap_target.hpp"
#include "kvpack/offload/prefetcher.hpp"
#include "kvpack/offload/secure_memory.hpp"
#include "kvpack/offload/tiers.hpp"
