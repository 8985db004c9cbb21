// expect: the budget N must be at least 2 * S + 1
#include <kvpack/kvpack.hpp>
using Bad = kvpack::KVCache<kvpack::H2OBudget<kvpack::Tokens<8>, 4>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
