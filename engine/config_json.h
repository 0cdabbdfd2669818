// SPDX-License-Identifier: Apache-2.0
// A config file's text into JSON, at the boundary where anything may arrive:
// a FIFO, a device, a directory, a file of gigabytes, a number beyond
// double's range, 100,000 nested arrays, a key given twice, invalid UTF-8.
// Each is an error (InvalidArgument, or IoError for what the OS refused)
// that names the file, the position and, where there is one, the key's
// path; none blocks, none throws, none recurses on the input's depth.
//
//   ReadConfigText   the bytes of a regular file, opened without blocking,
//                    at most kMaxConfigBytes;
//   ParseConfigJson  the JSON (comments allowed, a UTF-8 BOM skipped),
//                    nested at most kMaxConfigDepth deep, each key once per
//                    object (as DeepSpeed's reader requires).
//
// Thread-safety: free functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace strata {

// A DeepSpeed config is a few KB; 4 MiB leaves room for comments and long
// paths, and stops /dev/zero-like inputs long before memory runs out.
inline constexpr size_t kMaxConfigBytes = size_t{4} << 20;
// DeepSpeed configs nest 4 levels; 64 bounds every recursion that later
// walks the value (printing it, comparing it).
inline constexpr int kMaxConfigDepth = 64;

// The contents of `path`. IoError (with errno) when it cannot be opened or
// read; InvalidArgument when it is a directory, not a regular file (a FIFO,
// a character or block device, a socket: saying which), or larger than
// `max_bytes`.
Result<std::string> ReadConfigText(const std::string& path, size_t max_bytes = kMaxConfigBytes);

// Parses `text`; `source` names it in messages ("ds.json"). Every error found
// before the parse stops is reported, one per line: a syntax error (source:
// line:column and what was read), a number out of double's range or nesting
// deeper than `max_depth` (each naming the key path too), a key given twice
// in one object (its path and both positions; the parse goes on after it).
Result<nlohmann::json> ParseConfigJson(std::string_view text, const std::string& source,
                                       int max_depth = kMaxConfigDepth);

// One message of several errors: the first as it is, each further one on a
// line of its own (the first kConfigErrorsShown), then the count ("(3
// errors)"). One error is its own text.
inline constexpr size_t kConfigErrorsShown = 20;  // a file of 100,000 unknown keys gets a readable message
std::string JoinConfigErrors(const std::vector<std::string>& errors);

// True when `j` nests deeper than `max` levels (walked without recursion: a
// value built in code may be of any depth).
bool JsonDeeperThan(const nlohmann::json& j, int max);

// True when `s` is valid UTF-8 (what a JSON string must be).
bool IsUtf8(std::string_view s);

// `s` for a message: at most `max` bytes (then "..."), control bytes and
// bytes that are not UTF-8 written as \xNN.
std::string PrintableText(std::string_view s, size_t max = 80);

}  // namespace strata
