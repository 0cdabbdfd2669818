// SPDX-License-Identifier: Apache-2.0
// The config's field tables (engine/config.cc's, internal): a section's
// rows, read in order by ReadSection and written by WriteSection, so that a
// field added once is read, range-checked and written back.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "engine/config_reader.h"

namespace strata::config_internal {

// Reads `name` and its `stage3_` spelling; both present and different is an error.
template <typename T>
Status Stage3Int(Obj& o, const std::string& name, T* out, double lo, double hi) {
  T a = *out, b = *out;
  RETURN_IF_ERROR(FirstError({o.Int(name, &a, lo, hi, true), o.Int("stage3_" + name, &b, lo, hi, true)}));
  if (o.Has(name) && o.Has("stage3_" + name) && a != b)
    return o.Error(name, "given as both \"" + name + "\" (" + std::to_string(a) + ") and \"stage3_" + name +
                             "\" (" + std::to_string(b) + "); keep one");
  *out = o.Has(name) ? a : b;
  return Status::OK();
}

// ---- The field table ---------------------------------------------------------
//
// Each section of the config (the top level, "fp16", "zero_optimization",
// ...) is a Section: rows that ReadSection reads in order (every error is
// recorded in Ctx::errors, in that order) and WriteSection writes, then the
// section's DeepSpeed keys that strata does not implement. A row is
// - a field: a key bound to a member of the section's struct, with its range
//   (numbers) or allowed spellings (strings): read, range-checked and written
//   back, so that a field added once is all three;
// - a child: a key holding a JSON object, read into a member struct by that
//   struct's Section (or, nested, into the section's own struct);
// - a rule: what a field cannot say (the batch-size rule, legacy spellings,
//   aliases, checks across keys), code that reads where it stands among the
//   fields and, where it has something to write, code that writes.
// The defaults are the structs' initializers (config.h): a key left out
// leaves its member as it is.

template <typename S>
using Member = std::variant<bool S::*, int S::*, int64_t S::*, uint64_t S::*, double S::*, std::string S::*>;

// A field's options (a bit set).
enum FieldOption : unsigned {
  kAuto = 1,       // "auto" keeps the default (sizes that only tune performance)
  kOpenBelow = 2,  // a number's range is (lo, hi], not [lo, hi]
  kStage3 = 4,     // also read as "stage3_<key>" (ZeRO-3's spelling; given both, they must agree) and
                   // written so; "auto" keeps the default
  kOmitEmpty = 8,  // a string written only when not empty
};

template <typename S>
struct Row {
  std::string key;
  std::optional<Member<S>> member;             // set for a field
  double lo = 0, hi = 0;                       // a number's range
  unsigned options = 0;                        // FieldOption bits
  std::vector<std::string> choices;            // a string's allowed spellings (none: any string)
  std::function<Status(Obj&, S*, Ctx*)> read;  // a child or a rule
  std::function<void(const S&, json*)> write;  // a child or a rule (null: writes nothing)

  bool Has(FieldOption o) const { return (options & o) != 0; }
};

template <typename S>
struct Section {
  std::vector<Row<S>> rows;
  std::vector<Ignored> ignored;
};

template <typename S, typename T>
Row<S> FieldRow(std::string key, T S::*m, double lo = 0, double hi = 0, unsigned options = 0) {
  Row<S> r;
  r.key = std::move(key);
  r.member = m;
  r.lo = lo, r.hi = hi;
  r.options = options;
  return r;
}
template <typename S>
Row<S> Flag(std::string key, bool S::*m) {
  return FieldRow(std::move(key), m);
}
// An integer member in [lo, hi]; 5e8 is accepted for 500000000 (DeepSpeed configs write it so).
template <typename S, typename T>
Row<S> Int(std::string key, T S::*m, double lo, double hi, unsigned options = 0) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  return FieldRow(std::move(key), m, lo, hi, options);
}
template <typename S>
Row<S> Real(std::string key, double S::*m, double lo, double hi, unsigned options = 0) {
  return FieldRow(std::move(key), m, lo, hi, options);
}
template <typename S>
Row<S> Text(std::string key, std::string S::*m, unsigned options = 0) {
  return FieldRow(std::move(key), m, 0, 0, options);
}
// One of `choices`, compared case-insensitively; the member gets the canonical spelling.
template <typename S>
Row<S> OneOf(std::string key, std::string S::*m, std::vector<std::string> choices) {
  Row<S> r = FieldRow(std::move(key), m);
  r.choices = std::move(choices);
  return r;
}
template <typename S>
Row<S> Rule(std::function<Status(Obj&, S*, Ctx*)> read, std::function<void(const S&, json*)> write = nullptr) {
  Row<S> r;
  r.read = std::move(read);
  r.write = std::move(write);
  return r;
}

template <typename S>
Status ReadSection(Obj& o, S* s, const Section<S>& section, Ctx* ctx);
template <typename S>
json WriteSection(const S& s, const Section<S>& section);

// The object at `key`, read into member `m` by `section`.
template <typename S, typename C>
Row<S> Child(std::string key, C S::*m, const Section<C>& (*section)()) {
  return Rule<S>(
      [key, m, section](Obj& o, S* s, Ctx* ctx) -> Status {
        ASSIGN_OR_RETURN(Obj child, o.Child(key));
        return ReadSection(child, &(s->*m), section(), ctx);
      },
      [key, m, section](const S& s, json* j) { (*j)[key] = WriteSection(s.*m, section()); });
}
// The object at `key`, read into the section's own struct by `section`.
template <typename S>
Row<S> Nested(std::string key, const Section<S>& (*section)()) {
  return Rule<S>(
      [key, section](Obj& o, S* s, Ctx* ctx) -> Status {
        ASSIGN_OR_RETURN(Obj child, o.Child(key));
        return ReadSection(child, s, section(), ctx);
      },
      [key, section](const S& s, json* j) { (*j)[key] = WriteSection(s, section()); });
}

template <typename S>
Status ReadField(Obj& o, const Row<S>& r, S* s) {
  return std::visit(
      [&](auto m) -> Status {
        auto* out = &(s->*m);
        using T = std::remove_pointer_t<decltype(out)>;
        if constexpr (std::is_same_v<T, bool>) {
          return o.Bool(r.key, out);
        } else if constexpr (std::is_same_v<T, std::string>) {
          return r.choices.empty() ? o.String(r.key, out) : o.Choice(r.key, out, r.choices);
        } else if constexpr (std::is_same_v<T, double>) {
          return o.Double(r.key, out, r.lo, r.hi, r.Has(kOpenBelow), r.Has(kAuto));
        } else {
          if (r.Has(kStage3)) return Stage3Int(o, r.key, out, r.lo, r.hi);
          return o.Int(r.key, out, r.lo, r.hi, r.Has(kAuto));
        }
      },
      *r.member);
}

// Reads every row, then classifies the keys no row read. The errors are in
// ctx->errors (a row's returned error is recorded there already); a library
// exception is one more error, naming the row's key. Returns OK: the caller
// reads on and reports ctx->errors at the end.
template <typename S>
Status ReadSection(Obj& o, S* s, const Section<S>& section, Ctx* ctx) {
  for (const Row<S>& r : section.rows) {
    try {
      Status st = r.member ? ReadField(o, r, s) : r.read(o, s, ctx);
      (void)st;  // recorded in ctx->errors by Obj::Error / Obj::Fail
    } catch (const std::exception& e) {
      (void)o.Error(r.key.empty() ? "(a rule)" : r.key, std::string("cannot be read: ") + PrintableText(e.what(), 120));
    }
  }
  (void)o.Finish(section.ignored);
  return Status::OK();
}

template <typename S>
json WriteSection(const S& s, const Section<S>& section) {
  json j = json::object();
  for (const Row<S>& r : section.rows) {
    if (!r.member) {
      if (r.write) r.write(s, &j);
      continue;
    }
    std::visit(
        [&](auto m) {
          const auto& v = s.*m;
          if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>)
            if (r.Has(kOmitEmpty) && v.empty()) return;
          j[r.Has(kStage3) ? "stage3_" + r.key : r.key] = v;
        },
        *r.member);
  }
  return j;
}

}  // namespace strata::config_internal
