#include "io/namelist.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstddef>

#include "comm/check.hpp"

namespace ddp::nml {
namespace {

// Lexing first (strings, comments and line numbers are settled there), then a
// small recursive-descent parser over the tokens.
enum class Tok { Word, String, Equals, Comma, Slash, Open, Close, End };

struct Token {
  Tok type;
  std::string text;  // as written; Open: the group name
  int line;
  std::string str;  // Tok::String: the decoded contents
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool is_alnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }

// Unquoted words hold names, numbers and logicals: `1.d-3`, `.true.`, `batch_size`.
bool is_word_char(char c) { return is_alnum(c) || c == '_' || c == '.' || c == '+' || c == '-'; }

bool is_identifier(const std::string& s) {
  if (s.empty() || !std::isalpha(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return is_alnum(c) || c == '_'; });
}

[[noreturn]] void fail(const std::string& path, int line, const std::string& what) {
  throw InputError(path + ":" + std::to_string(line) + ": " + what);
}

std::vector<Token> lex(const std::string& text, const std::string& path) {
  std::vector<Token> toks;
  const std::size_t n = text.size();
  std::size_t i = 0;
  int line = 1;
  while (i < n) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      ++i;
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (c == '!') {
      while (i < n && text[i] != '\n') ++i;
    } else if (c == '=' || c == ',' || c == '/') {
      toks.push_back({c == '=' ? Tok::Equals : c == ',' ? Tok::Comma : Tok::Slash, {c}, line, {}});
      ++i;
    } else if (c == '&' || c == '$') {
      std::size_t j = i + 1;
      while (j < n && (is_alnum(text[j]) || text[j] == '_')) ++j;
      std::string name = lower(text.substr(i + 1, j - i - 1));
      if (name.empty()) fail(path, line, std::string("expected a group name after '") + c + "'");
      if (name == "end")
        toks.push_back({Tok::Close, text.substr(i, j - i), line, {}});
      else
        toks.push_back({Tok::Open, name, line, {}});
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string s;
      std::size_t j = i + 1;
      for (;; ++j) {
        if (j >= n || text[j] == '\n') fail(path, line, "unterminated string");
        if (text[j] != c) {
          s += text[j];
        } else if (j + 1 < n && text[j + 1] == c) {
          s += c;  // a doubled quote stands for one
          ++j;
        } else {
          break;
        }
      }
      toks.push_back({Tok::String, text.substr(i, j + 1 - i), line, s});
      i = j + 1;
    } else if (is_word_char(c)) {
      std::size_t j = i;
      while (j < n && is_word_char(text[j])) ++j;
      toks.push_back({Tok::Word, text.substr(i, j - i), line, {}});
      i = j;
    } else {
      fail(path, line, std::string("unexpected character '") + c + "'");
    }
  }
  // An error at the end of the file points at its last token, not a trailing blank line.
  toks.push_back({Tok::End, "end of file", toks.empty() ? line : toks.back().line, {}});
  return toks;
}

class Parser {
 public:
  Parser(std::vector<Token> toks, const std::string& path) : toks_(std::move(toks)), path_(path) {}

  std::vector<Group> run() {
    std::vector<Group> groups;
    while (peek().type != Tok::End) {
      const Token& t = next();
      if (t.type != Tok::Open) fail(path_, t.line, "text outside a group: '" + t.text + "'");
      groups.push_back(group(t));
    }
    return groups;
  }

 private:
  const Token& peek(std::size_t ahead = 0) const { return toks_[std::min(pos_ + ahead, toks_.size() - 1)]; }
  const Token& next() {
    const Token& t = peek();
    if (pos_ < toks_.size() - 1) ++pos_;
    return t;
  }

  Group group(const Token& open) {
    Group g{open.text, open.line, {}};
    for (;;) {
      const Token& t = next();
      switch (t.type) {
        case Tok::Slash:
        case Tok::Close:
          return g;
        case Tok::Comma:
          continue;
        case Tok::Word:
          g.entries.push_back(entry(g, t));
          continue;
        case Tok::End:
        case Tok::Open:
          fail(path_, t.line, "missing '/' closing &" + g.name + " opened at line " + std::to_string(g.line));
        default:
          fail(path_, t.line, "expected a key in &" + g.name + ", got '" + t.text + "'");
      }
    }
  }

  Entry entry(const Group& g, const Token& key_tok) {
    Entry e{lower(key_tok.text), key_tok.line, {}};
    if (!is_identifier(e.key)) fail(path_, e.line, "invalid key name '" + key_tok.text + "'");
    if (peek().type != Tok::Equals) fail(path_, e.line, "expected '=' after '" + e.key + "'");
    next();
    for (const Entry& other : g.entries)
      if (other.key == e.key)
        fail(path_, e.line,
             "duplicate key '" + e.key + "' in &" + g.name + " (first at line " + std::to_string(other.line) +
                 ")");
    // The list goes on until the next `key =`, a terminator or a non-value.
    for (;;) {
      const Token& v = peek();
      if (v.type == Tok::String) {
        Value val;
        val.kind = Kind::String;
        val.text = v.text;
        val.s = v.str;
        val.line = v.line;
        e.values.push_back(val);
      } else if (v.type == Tok::Word && peek(1).type != Tok::Equals) {
        auto val = parse_literal(v.text, v.line);
        // `epochs = 1  lr 0.1`: a name followed by a value is a key missing its '='.
        const Tok after = peek(1).type;
        if (!val && is_identifier(v.text) && !e.values.empty() &&
            (after == Tok::Word || after == Tok::String))
          return e;
        if (!val && is_identifier(v.text))
          fail(path_, v.line,
               "expected a value for '" + e.key + "', got '" + v.text + "' (strings need quotes)");
        if (!val) fail(path_, v.line, "invalid value '" + v.text + "' for '" + e.key + "'");
        e.values.push_back(*val);
      } else {
        if (e.values.empty()) fail(path_, e.line, "missing value for '" + e.key + "'");
        return e;
      }
      next();
      if (peek().type == Tok::Comma) {
        next();
        // Fortran reads `1,,2` as a null value; here it is almost always a typo.
        if (peek().type == Tok::Comma) fail(path_, peek().line, "empty value in the list of '" + e.key + "'");
      }
    }
  }

  std::vector<Token> toks_;
  std::size_t pos_ = 0;
  const std::string& path_;
};

std::size_t count_digits(const std::string& s, std::size_t p) {
  std::size_t d = 0;
  while (p + d < s.size() && std::isdigit(static_cast<unsigned char>(s[p + d]))) ++d;
  return d;
}

}  // namespace

std::vector<Group> parse(const std::string& text, const std::string& path) {
  return Parser(lex(text, path), path).run();
}

std::optional<Value> parse_literal(const std::string& word, int line) {
  Value v;
  v.text = word;
  v.line = line;
  const std::string w = lower(word);
  const bool is_true = w == ".true." || w == ".t." || w == "t" || w == "true";
  const bool is_false = w == ".false." || w == ".f." || w == "f" || w == "false";
  if (is_true || is_false) {
    v.kind = Kind::Logical;
    v.b = is_true;
    return v;
  }

  // [+-] digits [. digits] [(e|d) [+-] digits], with a digit somewhere in the mantissa.
  std::size_t p = (!w.empty() && (w[0] == '+' || w[0] == '-')) ? 1 : 0;
  const std::size_t int_digits = count_digits(w, p);
  p += int_digits;
  std::size_t frac_digits = 0;
  const bool dot = p < w.size() && w[p] == '.';
  if (dot) p += 1 + (frac_digits = count_digits(w, p + 1));
  if (int_digits + frac_digits == 0) return std::nullopt;
  const bool exponent = p < w.size() && (w[p] == 'e' || w[p] == 'd');
  if (exponent) {
    if (++p < w.size() && (w[p] == '+' || w[p] == '-')) ++p;
    const std::size_t exp_digits = count_digits(w, p);
    if (exp_digits == 0) return std::nullopt;
    p += exp_digits;
  }
  if (p != w.size()) return std::nullopt;

  // from_chars takes no leading '+' and no Fortran 'd' exponent.
  std::string num = w[0] == '+' ? w.substr(1) : w;
  std::replace(num.begin(), num.end(), 'd', 'e');
  const char* end = num.data() + num.size();
  if (!dot && !exponent) {
    v.kind = Kind::Int;
    auto [ptr, ec] = std::from_chars(num.data(), end, v.i);
    if (ec != std::errc() || ptr != end) return std::nullopt;  // out of int64 range
    v.r = static_cast<double>(v.i);
    return v;
  }
  v.kind = Kind::Real;
  auto [ptr, ec] = std::from_chars(num.data(), end, v.r);
  if (ec != std::errc() || ptr != end) return std::nullopt;  // out of double range
  return v;
}

std::optional<std::string> unquote(const std::string& text) {
  if (text.size() < 2) return std::nullopt;
  const char q = text.front();
  if ((q != '\'' && q != '"') || text.back() != q) return std::nullopt;
  std::string s;
  for (std::size_t i = 1; i + 1 < text.size(); ++i) {
    if (text[i] == q) {
      if (i + 2 >= text.size() || text[i + 1] != q) return std::nullopt;  // a lone quote ends it early
      ++i;
    }
    s += text[i];
  }
  return s;
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    out += c;
    if (c == '\'') out += c;
  }
  return out + "'";
}

std::string trim(const std::string& text) {
  const auto b = text.find_first_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : text.substr(b, text.find_last_not_of(" \t\r\n") - b + 1);
}

std::vector<std::string> split_list(const std::string& text) {
  if (trim(text).empty()) return {};
  std::vector<std::string> pieces;
  std::string cur;
  char quote_char = 0;
  int depth = 0;
  for (char c : text) {
    if (quote_char) {
      if (c == quote_char) quote_char = 0;  // a doubled quote reopens at once: same result
    } else if (c == '\'' || c == '"') {
      quote_char = c;
    } else if (c == '(') {
      ++depth;
    } else if (c == ')') {
      --depth;
    } else if (c == ',' && depth == 0) {
      pieces.push_back(trim(cur));
      cur.clear();
      continue;
    }
    cur += c;
  }
  pieces.push_back(trim(cur));
  return pieces;
}

}  // namespace ddp::nml
