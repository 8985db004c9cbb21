// kvpack umbrella header: everything a user needs to build and use KVCache<Policy...>.
#pragma once

#include "kvpack/calibration/calibrated_cache.hpp"
#include "kvpack/config.hpp"
#include "kvpack/kv_cache.hpp"
#include "kvpack/numeric.hpp"
#include "kvpack/policy.hpp"
#include "kvpack/result.hpp"
#include "kvpack/rotation/rotated_cache.hpp"
