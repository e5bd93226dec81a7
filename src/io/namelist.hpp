#pragma once
// A Fortran-namelist reader for the subset real input files use:
//
//   ! comment
//   &train  epochs = 10, lr = 1.d-3, nesterov = .true.
//           layers = 'linear(256)', 'relu',   ! a list may span lines
//                    'linear(10)' /
//
// Groups open with `&name` (or `$name`) and close with `/`, `&end` or `$end`.
// Names are case-insensitive and stored lowercase. Strings are quoted with '
// or " (a doubled quote is a quote). The result is generic: the typed config
// (train/config.cpp) decides what the keys mean. Syntax errors throw
// ddp::InputError "path:line: what".

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp::nml {

enum class Kind { Int, Real, Logical, String };

struct Value {
  Kind kind = Kind::String;
  std::string text;    // as written: "1.d-3", "'it''s'", ".T."
  std::int64_t i = 0;  // Kind::Int
  double r = 0.0;      // Kind::Int and Kind::Real
  bool b = false;      // Kind::Logical
  std::string s;       // Kind::String, quotes removed
  int line = 0;
};

struct Entry {
  std::string key;  // lowercase
  int line = 0;
  std::vector<Value> values;  // one or more, in order
};

struct Group {
  std::string name;  // lowercase, without '&'
  int line = 0;
  std::vector<Entry> entries;  // in file order; keys unique within the group
};

// Parse namelist text; `path` only prefixes error messages.
std::vector<Group> parse(const std::string& text, const std::string& path);

// One unquoted word as an integer, real or logical; nullopt if it is none of them.
std::optional<Value> parse_literal(const std::string& word, int line = 0);

// "'it''s'" -> "it's"; nullopt unless `text` is exactly one quoted string.
std::optional<std::string> unquote(const std::string& text);

// The namelist literal for a string: it's -> 'it''s'.
std::string quote(const std::string& s);

// `text` without the blanks, tabs and line ends at its two ends.
std::string trim(const std::string& text);

// Split at commas outside quotes and parentheses, trimming blanks:
// "conv(8,3), relu" -> {"conv(8,3)", "relu"}. Empty text gives no pieces.
std::vector<std::string> split_list(const std::string& text);

}  // namespace ddp::nml
