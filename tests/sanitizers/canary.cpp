// Sanitizer canary: each mode commits one bug on purpose. The sanitizer builds run it and pass
// only when the sanitizer's report appears, which proves the stage really is instrumented
// (a sanitizer stage that silently lost its flags would otherwise pass everything).
#include <climits>
#include <cstdio>
#include <cstring>
#include <thread>

namespace {

int heap_overflow(int argc) {
  int* p = new int[4]{1, 2, 3, 4};
  volatile int i = 3 + argc;  // argc >= 2 here: one past the end, unknown to the compiler
  const int v = p[i];
  delete[] p;
  return v;
}

int signed_overflow() {
  volatile int x = INT_MAX;
  const int y = x + 1;
  return y;
}

int data_race() {
  int counter = 0;  // written by two threads without synchronisation
  std::thread a([&counter] { for (int i = 0; i < 1000; ++i) ++counter; });
  std::thread b([&counter] { for (int i = 0; i < 1000; ++i) ++counter; });
  a.join();
  b.join();
  return counter;
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  int r = 0;
  if (std::strcmp(mode, "heap-overflow") == 0) r = heap_overflow(argc);
  else if (std::strcmp(mode, "signed-overflow") == 0) r = signed_overflow();
  else if (std::strcmp(mode, "data-race") == 0) r = data_race();
  else {
    std::printf("usage: sanitizer_canary heap-overflow|signed-overflow|data-race\n");
    return 2;
  }
  std::printf("canary '%s' was not caught (result %d)\n", mode, r);
  return 1;
}
