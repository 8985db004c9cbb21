// expect: the budget N counts the observation window and must exceed Window
#include <kvpack/kvpack.hpp>
using Bad = kvpack::KVCache<kvpack::SnapKVBudget<kvpack::Tokens<32>, 32>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
