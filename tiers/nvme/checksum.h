// SPDX-License-Identifier: Apache-2.0
// Checksums for data at rest: crc32c (Castagnoli) and xxhash64.
//
// crc32c uses the SSE4.2 `crc32` instruction when the CPU has it (chosen at
// run time; three interleaved streams so the instruction's latency does not
// bound throughput), else a slicing-by-8 table. xxhash64 is the reference
// algorithm (XXH64, seed 0 unless given). Both are plain C++, no dependencies.
//
// The NVMe tier keeps one checksum per `checksum_block` of every extent and
// verifies it on read (tiers/nvme/block_checksums.h).
//
// Ownership: nothing is owned; callers pass their bytes.
//
// Thread-safety: all functions are pure; the lookup tables are built once, on
// first use, by a thread-safe static initializer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace strata {

enum class ChecksumKind : uint8_t { kNone, kCrc32c, kXxh64 };

std::string_view ChecksumName(ChecksumKind kind);                   // "none", "crc32c", "xxh64"
std::optional<ChecksumKind> ParseChecksumKind(std::string_view s);  // also "xxhash64", "xxhash"

// crc32c of data[0, n). Crc32c("123456789") == 0xE3069283.
uint32_t Crc32c(const void* data, size_t n);
// Continues a crc32c: Crc32cExtend(Crc32c(a), b) == Crc32c(a || b); Crc32cExtend(0, x) ==
// Crc32c(x).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

// XXH64 of data[0, n) with `seed`.
uint64_t XxHash64(const void* data, size_t n, uint64_t seed = 0);

// The checksum `kind` of data[0, n) as 64 bits (crc32c zero-extended). 0 for kNone.
uint64_t ComputeChecksum(ChecksumKind kind, const void* data, size_t n);

// The two crc32c implementations, exposed so tests can compare them.
namespace checksum_internal {
bool Crc32cHardwareAvailable();  // the CPU has SSE4.2
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);
// Only when Crc32cHardwareAvailable().
uint32_t Crc32cExtendHardware(uint32_t crc, const void* data, size_t n);
}  // namespace checksum_internal

}  // namespace strata
