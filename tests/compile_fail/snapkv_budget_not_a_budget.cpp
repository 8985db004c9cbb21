// expect: Budget must be kvpack::Tokens<N> or kvpack::Fraction<Num, Den> (of the prompt)
#include <kvpack/kvpack.hpp>
using Bad = kvpack::KVCache<kvpack::SnapKVBudget<int>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
