// A deliberately broken harness: run.sh fuzzes it first and fails unless libFuzzer finds its heap
// overflow quickly (coverage feedback and AddressSanitizer live), and unless, with CANARY_UB set, any
// input stops it with an UndefinedBehaviorSanitizer report (UBSan live and fatal). A toolchain that
// quietly lost a sanitizer or the coverage feedback cannot pass the real harnesses.
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool ub = std::getenv("CANARY_UB") != nullptr;
  if (ub) {
    volatile int big = INT_MAX;
    return big + static_cast<int>(size + 1);  // signed overflow
  }
  // A 4-byte key found one byte at a time: only coverage feedback gets there within seconds.
  if (size >= 4 && data[0] == 'F' && data[1] == 'U' && data[2] == 'Z' && data[3] == 'Z') {
    char* p = new char[size];
    static_cast<volatile char*>(p)[size] = 0;  // one past the end
    delete[] p;
  }
  return 0;
}
