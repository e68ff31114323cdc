#pragma once
// splitmix64 (Steele, Lea and Flood): advances `state` and returns the next 64 random bits. Seeds the
// sampler's generators, the built-in model's weights and the tests' random inputs.
#include <cstdint>

namespace dsaserve {

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace dsaserve
