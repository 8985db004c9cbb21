/* The C ABI from C: the header compiles as C11 with -Wpedantic -Werror, the library links, and one
 * round trip behaves: all V = 1 gives out = 1 (a constant group decodes exactly); errors carry
 * messages; a freed sequence and a destroyed pool are rejected. Exit 0 on success. */
#include <kvpack/c/kvpack.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;
#define CHECK(cond, what)                                                        \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "FAIL: %s (%s)\n", what, kvpack_last_error());             \
      ++failures;                                                                \
    }                                                                            \
  } while (0)

enum { L = 2, QH = 4, KH = 2, D = 64, N = 40 };

int main(void) {
  static float k[N * KH * D], v[N * KH * D], q[N * QH * D], out[N * QH * D];
  int32_t pos[N];
  kvpack_pool_config cfg;
  kvpack_pool* pool = NULL;
  kvpack_seq s;
  int64_t len = 0;
  int i, l;
  kvpack_kernel_info kernel;
  double tol;
  memset(&cfg, 0, sizeof cfg);
  cfg.shape.layers = L;
  cfg.shape.q_heads = QH;
  cfg.shape.kv_heads = KH;
  cfg.shape.head_dim = D;
  cfg.shape.max_tokens = 128;
  cfg.byte_budget = 1u << 20;
  cfg.max_sequences = 2;
  for (i = 0; i < N * KH * D; ++i) {
    k[i] = (float)((i * 7919) % 101) / 50.0f - 1.0f;
    v[i] = 1.0f;
  }
  for (i = 0; i < N * QH * D; ++i) q[i] = (float)((i * 104729) % 97) / 48.0f - 1.0f;
  for (i = 0; i < N; ++i) pos[i] = i;

  CHECK(kvpack_abi_version() == KVPACK_C_ABI_VERSION, "abi version");
  CHECK(kvpack_pool_create("no-such-policy", &cfg, &pool) == KVPACK_ERR_INVALID_ARGUMENT, "bad name rejected");
  CHECK(strstr(kvpack_last_error(), "no-such-policy") != NULL, "message names the policy");
  CHECK(kvpack_policy_evicts(0) == 0 && kvpack_policy_evicts(-1) == -1, "policy_evicts: fp32 keeps tokens, -1 out of range");
  CHECK(kvpack_pool_create("q8_0/q4_1", &cfg, &pool) == KVPACK_OK, "pool_create");
  CHECK(kvpack_seq_create(pool, &s) == KVPACK_OK, "seq_create");
  CHECK(kvpack_pool_kernel(pool, &kernel) == KVPACK_OK && kernel.backend != NULL, "pool_kernel");
  /* V = 1: fp32 rounding, plus for integer P.V (kernel.value_group > 0) 8 * value_error * the sum
     over tokens of their tile's largest weight p * scale: <= 16 per tile-sum of p, scale <= 2/15. */
  tol = 1e-5 + (kernel.value_group > 0 ? 8.0 * kernel.value_error * 16.0 * 2.0 / 15.0 : 0.0);
  for (l = 0; l < L; ++l) {
    CHECK(kvpack_append(pool, s, l, k, v, pos, N / 2) == KVPACK_OK, "append 1");
    CHECK(kvpack_append(pool, s, l, k, v, pos + N / 2, N / 2) == KVPACK_OK, "append 2");
    CHECK(kvpack_attend(pool, s, l, q, N / 2, out, NULL) == KVPACK_OK, "attend");
    for (i = 0; i < N / 2 * QH * D; ++i)
      if (fabs(out[i] - 1.0) > tol) {
        CHECK(0, "all V = 1 must give out = 1");
        break;
      }
  }
  CHECK(kvpack_seq_length(pool, s, &len) == KVPACK_OK && len == N, "length");
  CHECK(kvpack_append(pool, s, L, k, v, pos, 1) == KVPACK_ERR_INVALID_ARGUMENT, "layer out of range");
  CHECK(kvpack_seq_free(pool, s) == KVPACK_OK, "free");
  CHECK(kvpack_attend(pool, s, 0, q, 1, out, NULL) == KVPACK_ERR_INVALID_ARGUMENT, "freed handle rejected");
  kvpack_pool_destroy(pool);
  CHECK(kvpack_seq_create(pool, &s) == KVPACK_ERR_INVALID_ARGUMENT, "destroyed pool rejected");
  kvpack_pool_destroy(pool);
  printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
